"""The repository's kernel data with a platform's recordings left out, or with all of them made.

GB10's kernel patterns come from public sources; tests whose premise is that no sm_121 trace has confirmed them yet
build their catalog without its recordings, so they keep testing that premise after the users commit their first GB10
recordings (docs/GB10.md, step 6) and CI stays green on the users' own main. The opposite, every entry recorded, is
what GB10.md promises a strict nightly after its steps 3 and 4."""
from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import yaml

from harness.config.catalog import CONFIG_DIR, Catalog, entry_rules, load_verified
from harness.core.platform import platform_matches
from harness.kernelpath.recorder import verified_entry


def write_verified_without(platform: str, dest: Path) -> Path:
    """configs/verified/*.yaml copied to `dest` with every recorded entry whose selector matches `platform` left out."""
    dest.mkdir(parents=True, exist_ok=True)
    for file in sorted((CONFIG_DIR / "verified").glob("*.yaml")):
        data = load_verified(file)
        for mapping in (data.get("values") or {}).values():
            for spec in (mapping or {}).values():
                kernels = (spec or {}).get("kernels") or {}
                for selector in [s for s in kernels if platform_matches(s, platform)]:
                    del kernels[selector]
        (dest / file.name).write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


@lru_cache(maxsize=None)
def verified_dir_without(platform: str) -> Path:
    """A process-wide copy from `write_verified_without` (removed at exit): for module-level catalogs and env vars."""
    dest = Path(tempfile.mkdtemp(prefix=f"suite-unrecorded-{platform}-"))
    atexit.register(shutil.rmtree, dest, True)
    return write_verified_without(platform, dest)


def catalog_unrecorded_on(platform: str) -> Catalog:
    """The catalog as it was before any recording on `platform`: every other platform's recordings still count."""
    return Catalog(verified_dir=verified_dir_without(platform))


def write_verified_everywhere(platform: str, dest: Path) -> Path:
    """configs/verified/*.yaml copied to `dest` plus, for every flavour, a recording of each kernel entry that applies to
    `platform` and declares `must` patterns, as scripts/record_kernels.py --accept writes it (its `seen` names are the
    flavour's examples), except for values the flavour does not run there."""
    write_verified_without(platform, dest)
    catalog = Catalog(verified_dir=dest)
    for name, flavour in catalog.flavours.items():
        file = dest / f"{name}.yaml"
        data = load_verified(file) if file.is_file() else {}
        for axis, values in flavour.values.items():
            for value in values:
                if not flavour.value_runs(axis, value, platform)[0]:
                    continue
                for selector, entry in flavour.kernel_entries(axis, value, platform):
                    if not entry.get("must"):
                        continue
                    kernels = (data.setdefault("values", {}).setdefault(axis, {}).setdefault(value, {})
                               .setdefault("kernels", {}))
                    kernels[selector] = verified_entry(f"a simulated {platform} trace, vLLM 0.0.0, 2000-01-01",
                                                       entry["must"], entry_rules(entry), entry.get("seen") or [],
                                                       "simulated")
        if data:
            file.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest
