"""MXFP4 weights repacked once at load for the decode kernels (`pack_mxfp4`), and the activation form
they consume (`prepare_activation`).

Why a repack: the old fma16 loop spent ~42 thread instructions per 32-bit weight word (8 codes),
19 of them moving nibbles into fp16 fields (Nsight Compute on the H200, see NOTES.md). A layout
chosen for the decode brings that to 8, and puts each word where a tensor-core fragment needs it.

Layout (W [N, K] = out x in, gpt-oss rows):
* rows padded to a multiple of 16 (one mma row tile), K to a multiple of 64 (one "chunk" = 2 MX
  blocks = 4 k-steps of 16). Padding is zero codes with scale byte 127 (exactly 0 contribution).
* `words` int32 [N/16, K/64, 32, 4]: [row tile r, chunk c, lane l, word j]. With g = l // 4 and
  t = l % 4, word j (k-step s = 4c + j, k0 = 16 s) holds the 8 codes of the m16n8k16 A fragment of
  lane l: rows (16r+g, 16r+g+8) x columns (k0+2t, k0+2t+1, k0+2t+8, k0+2t+9) -- so a warp's 16-byte
  loads are one contiguous 512-byte run, and each word decodes straight into the lane's 4 A
  registers (taken from Marlin's register-fragment layout and triton_kernels' Hopper value swizzle:
  order the bytes at load time so no shuffle or shared-memory round trip is needed at run time).
* `scales` uint8 [N/16, K/64, 8, 4]: [r, c, g, (row g blk 2c, row g+8 blk 2c, row g blk 2c+1,
  row g+8 blk 2c+1)] -- one 32-bit load per lane per chunk. Raw E8M0 bytes; a block whose scale is
  255 (NaN) gets all-zero codes, so the kernels' 0 * inf = NaN poisons exactly its row, as the
  reference does. Scale byte 0 (2**-127, fp32-subnormal) is read as 0 by the fast kernels: such a
  block contributes < 6 * 2**-127 * sum|x| (documented deviation; quantize_mxfp4 only emits it
  for blocks whose amax is below 2**-125).

Decode (8 integer instructions per word: 4 shifts/rotates + 4 LOP3; `decode_words` is the
reference implementation, gemv.py / csrc/mxfp4_mma.cu the kernels):

    M  = 0x8E008E00                       # fp16 bits 15 (sign) and 11..9 (e1 e0 m), both halves
    O0 = (w << 2) & M
    O1 = (w ^ (w << 6)) & M               # one LOP3 each: (a ^ b) & M
    O2 = (w ^ (w << 9)) & M
    O3 = (w ^ rotl(w, 13)) & M

Each O_j is an f16x2 whose halves hold code bits (s, e1, e0, m) at bits (15, 11, 10, 9): that fp16
equals value * 2**-14 (code 1 = 0.5 becomes the subnormal 2**-15, exactly). The four outputs are
GF(2)-linear in w and the 32x32 map is invertible, so `pack_mxfp4` solves for the word that
decodes to the wanted codes. Why not fewer: 4 outputs need 4 final masks, and no 3 shifts,
rotates or byte permutes (PRMT) give 4 disjoint translates of the 8 needed bit positions (brute
force, see NOTES.md), so at least 4 more instructions move bits: 8 is the floor for this family
(the current fma16 PTX: 19; Marlin's FP4->FP16 `(q & 0x80008000) | ((q & 0x70007000) >> 3)` per
pair plus its shifts: ~14 per word).

Activation form (`prepare_activation`): x [M, K] -> f16 x * 2**(14 - L_m) per token m, L_m =
floor(log2(max_k |x_mk|)), so |x_s| < 2**15 and every bf16 value is exactly representable (bf16 has
8 significand bits, fp16 11) unless it is 2**-28 below the token's max; the kernels multiply by
2**L_m at the end. The CUDA kernel builds the same thing in shared memory itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .mxfp4 import as_packed

ROW_TILE = 16
CHUNK_K = 64
F16_MASK = 0x8E008E00


def _bits32(v: int) -> int:
    return v & 0xFFFFFFFF


def _decode_int(w: int) -> tuple[int, int, int, int]:
    """Python-int version of the 8-instruction decode (used to build the pack matrix)."""
    rot = _bits32((w << 13) | (w >> 19))
    return (
        _bits32(w << 2) & F16_MASK,
        (w ^ _bits32(w << 6)) & F16_MASK,
        (w ^ _bits32(w << 9)) & F16_MASK,
        (w ^ rot) & F16_MASK,
    )


# Bit positions of the code bits inside one f16x2 output: (lane 0: m, e0, e1, s), (lane 1: same).
_POS = (9, 10, 11, 15, 25, 26, 27, 31)


def _out_vector(w: int) -> int:
    """w -> 32-bit vector of the decoded code bits: bit 8*j + i = bit _POS[i] of O_j."""
    outs = _decode_int(w)
    v = 0
    for j, o in enumerate(outs):
        for i, p in enumerate(_POS):
            if (o >> p) & 1:
                v |= 1 << (8 * j + i)
    return v


def _solve_matrix() -> list[int]:
    """INV[q] = 32-bit mask over output bits; w bit q = parity(d & INV[q])."""
    cols = [_out_vector(1 << q) for q in range(32)]  # A e_q
    # Gauss-Jordan over GF(2) on [A | I] (rows = output bits)
    rows = []
    for i in range(32):
        a = sum(((cols[q] >> i) & 1) << q for q in range(32))
        rows.append((a, 1 << i))
    for col in range(32):
        piv = next(r for r in range(col, 32) if (rows[r][0] >> col) & 1)
        rows[col], rows[piv] = rows[piv], rows[col]
        for r in range(32):
            if r != col and (rows[r][0] >> col) & 1:
                rows[r] = (rows[r][0] ^ rows[col][0], rows[r][1] ^ rows[col][1])
    return [rows[q][1] for q in range(32)]  # rows are now (e_q, inverse row q)


_INV = _solve_matrix()


def _byte_tables(device) -> torch.Tensor:
    """[4, 256] int64: entry [b, v] = the word bits that byte b of the desired vector d, equal to v, contributes
    (word bit q = parity(d & _INV[q]) is linear in d, so a word is the XOR of its four bytes' entries)."""
    cols = [sum(((_INV[q] >> i) & 1) << q for q in range(32)) for i in range(32)]  # word of d = e_i
    tab = [[0] * 256 for _ in range(4)]
    for b in range(4):
        for v in range(256):
            w = 0
            for i in range(8):
                if (v >> i) & 1:
                    w ^= cols[8 * b + i]
            tab[b][v] = w
    return torch.tensor(tab, dtype=torch.int64, device=device)


def decode_words(w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """int32 words -> the four f16x2 outputs as int64 bit patterns (torch reference of the decode)."""
    u = w.to(torch.int64) & 0xFFFFFFFF
    m = 0xFFFFFFFF
    rot = ((u << 13) | (u >> 19)) & m
    return (((u << 2) & m) & F16_MASK, (u ^ ((u << 6) & m)) & F16_MASK,
            (u ^ ((u << 9) & m)) & F16_MASK, (u ^ rot) & F16_MASK)


def _codes_to_f16_bits(c: torch.Tensor) -> torch.Tensor:
    c = c.to(torch.int64)
    return ((c & 7) << 9) | ((c & 8) << 12)


def _f16_bits_to_codes(b: torch.Tensor) -> torch.Tensor:
    return ((b >> 9) & 7) | ((b >> 12) & 8)


@dataclass
class PackedMXFP4:
    """Repacked MXFP4 weight(s). words int32 [*E, N/16, K/64, 32, 4], scales uint8 [*E, N/16, K/64, 8, 4].

    n, k: logical shape (out, in). `paired`: rows were permuted so row tile r holds gate rows
    2(8r+g) at g and up rows 2(8r+g)+1 at g+8 (gate_up of the gpt-oss MoE, SwiGLU in the epilogue).
    """

    words: torch.Tensor
    scales: torch.Tensor
    n: int
    k: int
    paired: bool = False
    # Largest E8M0 byte, found once at load by `pack_mxfp4` (the prefill kernel's bf16 form serves bytes <= 128);
    # None: not known (weights built another way), `scale_max` reads it from the tensor.
    max_scale: int | None = None

    @property
    def n_tiles(self) -> int:
        return self.words.shape[-4]

    @property
    def k_chunks(self) -> int:
        return self.words.shape[-3]

    @property
    def experts(self) -> int | None:
        return self.words.shape[0] if self.words.dim() == 5 else None

    def to(self, device) -> "PackedMXFP4":
        return PackedMXFP4(self.words.to(device), self.scales.to(device), self.n, self.k, self.paired, self.max_scale)

    def scale_max(self) -> int:
        """The largest E8M0 byte: `max_scale`, or read from the scales (a host sync; weights from `pack_mxfp4` carry
        it, so the served model never syncs here)."""
        if self.max_scale is not None:
            return self.max_scale
        return int(self.scales.max()) if self.scales.numel() else 0


def _pair_perm(n: int) -> torch.Tensor:
    """Packed row i <- original row perm[i]: tile row g = gate 2(8r+g), g+8 = up 2(8r+g)+1."""
    i = torch.arange(n)
    r, q = i // 16, i % 16
    return 16 * r + 2 * (q % 8) + q // 8


def pack_mxfp4(w: torch.Tensor, scales: torch.Tensor, paired: bool = False) -> PackedMXFP4:
    """(packed uint8 [*E, N, K//2] or checkpoint blocks [*E, N, K//32, 16], scales [*E, N, K//32])
    -> PackedMXFP4. Runs once at load (any device); exact: `unpack_mxfp4` gives the input back
    (except codes of NaN-scale blocks, zeroed on purpose)."""
    w = as_packed(w, scales)
    if w.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"packed weights and scales must be uint8, got {w.dtype}, {scales.dtype}")
    lead = w.shape[:-2]
    n, kh = w.shape[-2], w.shape[-1]
    k = kh * 2
    if k % 32 or scales.shape != (*lead, n, k // 32):
        raise ValueError(f"shape mismatch: packed {tuple(w.shape)}, scales {tuple(scales.shape)}")
    if paired and n % 16:
        raise ValueError(f"paired (gate/up) packing needs 2I to be a multiple of 16, got {n}")
    w = w.reshape(-1, n, kh)
    s = scales.reshape(-1, n, k // 32)
    e = w.shape[0]
    nt, kc = -(-n // ROW_TILE) * ROW_TILE // 16, -(-k // CHUNK_K) * CHUNK_K // 64
    words = torch.empty((e, nt, kc, 32, 4), dtype=torch.int32, device=w.device)
    sc = torch.empty((e, nt, kc, 8, 4), dtype=torch.uint8, device=w.device)
    # Experts a pass: the uint8 temporaries stay near 256 MB each. All 128 experts of one gpt-oss-120b
    # layer at once took ~2 GB per temporary plus 17 GB of int64 words and ran a GPU out of memory at load.
    group = max(1, (1 << 28) // (n * k))
    for e0 in range(0, e, group):
        e1 = min(e, e0 + group)
        words[e0:e1], sc[e0:e1] = _pack_group(w[e0:e1], s[e0:e1], n, k, paired)
    if not lead:
        words, sc = words[0], sc[0]
    else:
        words, sc = words.reshape(*lead, nt, kc, 32, 4), sc.reshape(*lead, nt, kc, 8, 4)
    return PackedMXFP4(words, sc, n, k, paired, int(s.max()) if s.numel() else 0)


def _pack_group(w: torch.Tensor, s: torch.Tensor, n: int, k: int, paired: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [e, n, k/2] + scales [e, n, k/32] -> (words int32 [e, nt, kc, 32, 4], scales uint8 [e, nt, kc, 8, 4])."""
    dev, e = w.device, w.shape[0]
    codes = torch.stack((w & 15, w >> 4), dim=-1).reshape(e, n, k)  # element 2i = low nibble
    nan_blk = s == 255
    if nan_blk.any():
        codes = codes.reshape(e, n, k // 32, 32).masked_fill(nan_blk.unsqueeze(-1), 0).reshape(e, n, k)
    if paired:
        perm = _pair_perm(n).to(dev)
        codes, s = codes[:, perm], s[:, perm]
    n_pad = -(-n // ROW_TILE) * ROW_TILE
    k_pad = -(-k // CHUNK_K) * CHUNK_K
    cp = torch.zeros((e, n_pad, k_pad), dtype=torch.uint8, device=dev)
    cp[:, :n, :k] = codes
    del codes
    sp = torch.full((e, n_pad, k_pad // 32), 127, dtype=torch.uint8, device=dev)
    sp[:, :n, : k // 32] = s
    nt, kc = n_pad // 16, k_pad // 64
    words = torch.empty((e, nt, kc, 32, 4), dtype=torch.int32, device=dev)
    step = max(1, (1 << 22) // (e * kc * 128))  # row tiles per pass: bounds the int64 temporaries (~32 MB)
    for r0 in range(0, nt, step):
        r1 = min(nt, r0 + step)
        words[:, r0:r1] = _pack_words(cp[:, 16 * r0 : 16 * r1])
    s4 = sp.reshape(e, nt, 2, 8, kc, 2).permute(0, 1, 4, 3, 5, 2)  # [e, r, c, g, blk half, row half]
    return words, s4.reshape(e, nt, kc, 8, 4).contiguous()


def _pack_words(cp: torch.Tensor) -> torch.Tensor:
    """codes uint8 [e, 16*nt, 64*kc] -> words int32 [e, nt, kc, 32, 4]."""
    e, n16, kp = cp.shape
    nt, kc = n16 // 16, kp // 64
    # codes [e, r, g8 (row half), g, c, j, kh8 (0: k0.., 1: k0+8..), t, pair] with
    # row = 16r + 8*g8 + g and k = 64c + 16j + 8*kh8 + 2t + pair
    c9 = cp.reshape(e, nt, 2, 8, kc, 4, 2, 4, 2)
    # output O_o, o = 2*kh8 + g8 (O0: row g k0, O1: row g+8 k0, O2: row g k0+8, O3: row g+8 k0+8)
    c9 = c9.permute(0, 1, 4, 3, 7, 5, 6, 2, 8)  # [e, r, c, g, t, j, kh8, g8, pair]
    bits = _codes_to_f16_bits(c9)  # f16 bits of each code (lane = pair)
    outs = (bits[..., 0] | (bits[..., 1] << 16)).reshape(e, nt, kc, 8, 4, 4, 4)  # last dim o
    # desired vector d: bit 8*o + i = bit _POS[i] of O_o; then word bit q = parity(d & INV[q])
    d = torch.zeros(outs.shape[:-1], dtype=torch.int64, device=cp.device)
    for o in range(4):
        for i, p in enumerate(_POS):
            d |= ((outs[..., o] >> p) & 1) << (8 * o + i)
    # word = A^-1 d over GF(2): XOR of each byte's column contributions (4 table lookups instead of 32 parities)
    lut = _byte_tables(d.device)
    word = lut[0][d & 255] ^ lut[1][(d >> 8) & 255] ^ lut[2][(d >> 16) & 255] ^ lut[3][(d >> 24) & 255]
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)  # [e, r, c, g, t, j]
    return word.reshape(e, nt, kc, 32, 4)


def unpack_mxfp4(p: PackedMXFP4) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of pack_mxfp4 through `decode_words` (the kernels' instruction sequence): ->
    (packed uint8 [*E, N, K//2], scales [*E, N, K//32]) in the original row order."""
    lead = p.words.shape[:-4]
    words = p.words.reshape(-1, *p.words.shape[-4:])
    sc = p.scales.reshape(-1, *p.scales.shape[-4:])
    e, nt, kc = words.shape[:3]
    outs = torch.stack(decode_words(words), dim=-1)  # [e, r, c, l, j, o]
    lanes = torch.stack((outs & 0xFFFF, outs >> 16), dim=-1)  # [e, r, c, l, j, o, pair]
    codes = _f16_bits_to_codes(lanes).reshape(e, nt, kc, 8, 4, 4, 2, 2, 2)  # [.., g, t, j, kh8, g8, pair]
    codes = codes.permute(0, 1, 7, 3, 2, 5, 6, 4, 8).reshape(e, nt * 16, kc * 64)
    s = sc.reshape(e, nt, kc, 8, 2, 2).permute(0, 1, 5, 3, 2, 4).reshape(e, nt * 16, kc * 2)
    codes, s = codes[:, : p.n, : p.k], s[:, : p.n, : p.k // 32]
    if p.paired:
        inv = torch.argsort(_pair_perm(p.n).to(codes.device))
        codes, s = codes[:, inv], s[:, inv]
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed.reshape(*lead, p.n, p.k // 2), s.to(torch.uint8).reshape(*lead, p.n, p.k // 32)


def activation_scale(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (row) powers of two: (up = 2**(14 - L), down = 2**L) float32 [M], L =
    floor(log2(max|x|)) read from the exponent bits, clamped to [-100, 127] (all-zero rows: -100)."""
    amax = x.to(torch.float32).abs().amax(dim=-1)
    lg = ((amax.view(torch.int32) >> 23) & 0xFF) - 127
    lg = lg.clamp(-100, 127)
    up = ((14 - lg + 127) << 23).view(torch.float32)
    down = ((lg + 127) << 23).view(torch.float32)
    return up, down


def prepare_activation(x: torch.Tensor, k_pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (xq int32 [M, K_pad/64, 4 (t), 4 (j), 2 (h)] f16x2 pairs of x * 2**(14-L_m),
    down float32 [M] = 2**L_m). Lane t's 8 words of a chunk are contiguous (two 16-byte loads), and
    the two B registers of k-step j, pairs (k0+2t, +1) and (k0+2t+8, +9), are adjacent."""
    m, k = x.shape
    up, down = activation_scale(x)
    xs = torch.zeros((m, k_pad), dtype=torch.float16, device=x.device)
    xs[:, :k] = (x.to(torch.float32) * up[:, None]).to(torch.float16)
    # k = 64c + 16j + 8h + 2t + pair -> [m, c, t, j, h, pair]
    xq = xs.view(m, k_pad // 64, 4, 2, 4, 2).permute(0, 1, 4, 2, 3, 5).contiguous()
    return xq.view(torch.int32).reshape(m, k_pad // 64, 4, 4, 2), down
