#!/usr/bin/env python3
"""Golden tables for tests/core/test_dtype.c, computed with numpy and ml_dtypes.

The tables are committed because CI has no ml_dtypes. To regenerate them (only needed
when the set of inputs below changes), from the repository root:

    pip install numpy ml_dtypes
    python3 tests/core/gen_dtype_tables.py            # writes tests/core/data/*.bin

and commit the changed files. The C test rebuilds the same input sets from the rules
documented here, so both sides must change together.

All files are raw little-endian arrays without a header:

  bf16_to_f32.bin      u32[65536]      f32 bits of every bf16 bit pattern
  f16_to_f32.bin       u32[65536]      f32 bits of every f16 bit pattern
  fp8_e4m3_to_f32.bin  u32[256]        f32 bits of every fp8 e4m3fn byte
  fp8_e5m2_to_f32.bin  u32[256]        f32 bits of every fp8 e5m2 byte
  f32_to_fp8_e4m3.bin  u8[65536]       e4m3fn byte of the f32 with bits (i << 16)
  f32_to_fp8_e5m2.bin  u8[65536]       e5m2 byte of the same inputs (non-saturating
                                       casts, as ml_dtypes does them)
  f32_to_bf16.bin      u16[65536][3]   bf16 of the f32 with bits (i << 16) | low,
                                       low in BF16_LOWS: just below, exactly at and just
                                       above the rounding midpoint, for every bf16
                                       pattern i (both parities of the kept bit)
  f32_to_f16.bin       u16[N][16]      f16 of the f32 with bits (i << 16) | low, low in
                                       F16_LOWS, for every i whose f32 exponent field is
                                       0, 255 or within 127 - 26 .. 127 + 16 (zero and
                                       f32 subnormals, inf/NaN, and every binade where f16
                                       rounding is not trivial, from below half the
                                       smallest f16 subnormal to past the largest finite
                                       value): N = 45 * 256 = 11520
"""

import os
import sys

import ml_dtypes
import numpy as np

# Low 16 bits appended to each bf16 pattern for the f32 -> bf16 table: one f32 ulp
# below the midpoint, the midpoint (ties to even), one ulp above.
BF16_LOWS = [0x7FFF, 0x8000, 0x8001]

# Low 16 bits for the f32 -> f16 table. f16 keeps 10 of the 23 mantissa bits, so for
# normal results the kept LSB is bit 13 and the midpoint is bit 12: 0x1000 / 0x3000 are
# ties with an even / odd kept bit, 0x0FFF, 0x1001, 0x2FFF, 0x3001 their neighbours. For
# subnormal results the midpoint lies in the upper 16 bits, and 0x0000 (exact tie),
# 0x0001 and 0x8000 (sticky bits just above) and 0xFFFF (just below the next pattern)
# decide them. The rest mix both cases (0x2000: exact with an odd kept bit; 0x1FFF,
# 0x7FFF, 0x8001, 0xBFFF, 0xF000: clearly above or below a midpoint, or an odd tie).
F16_LOWS = [0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2FFF,
            0x3000, 0x3001, 0x7FFF, 0x8000, 0x8001, 0xBFFF, 0xF000, 0xFFFF]

F16_EXP_MIN = 127 - 26
F16_EXP_MAX = 127 + 16


def f16_table_his():
  """The upper 16 bits of the f32 -> f16 inputs, in increasing order."""
  his = np.arange(65536, dtype=np.uint32)
  exp = (his >> 7) & 0xFF
  keep = (exp == 0) | (exp == 255) | ((exp >= F16_EXP_MIN) & (exp <= F16_EXP_MAX))
  return his[keep]


def f32_from_bits(bits):
  return np.asarray(bits, dtype=np.uint32).view(np.float32)


def write(out_dir, name, array, dtype):
  data = np.ascontiguousarray(array).astype(dtype).tobytes()
  with open(os.path.join(out_dir, name), "wb") as f:
    f.write(data)
  print(f"{name}: {len(data)} bytes")
  return len(data)


def main():
  out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data")
  os.makedirs(out_dir, exist_ok=True)
  all16 = np.arange(65536, dtype=np.uint32)
  all8 = np.arange(256, dtype=np.uint32)
  total = 0
  with np.errstate(all="ignore"):  # NaN and overflow casts are the point here
    # Decoding.
    bf16 = all16.astype(np.uint16).view(ml_dtypes.bfloat16)
    total += write(out_dir, "bf16_to_f32.bin", bf16.astype(np.float32).view(np.uint32), "<u4")
    f16 = all16.astype(np.uint16).view(np.float16)
    total += write(out_dir, "f16_to_f32.bin", f16.astype(np.float32).view(np.uint32), "<u4")
    e4m3 = all8.astype(np.uint8).view(ml_dtypes.float8_e4m3fn)
    total += write(out_dir, "fp8_e4m3_to_f32.bin", e4m3.astype(np.float32).view(np.uint32), "<u4")
    e5m2 = all8.astype(np.uint8).view(ml_dtypes.float8_e5m2)
    total += write(out_dir, "fp8_e5m2_to_f32.bin", e5m2.astype(np.float32).view(np.uint32), "<u4")

    # Encoding to fp8: every bf16 pattern taken as an f32 input.
    x = f32_from_bits(all16 << 16)
    total += write(out_dir, "f32_to_fp8_e4m3.bin",
                   x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), "<u1")
    total += write(out_dir, "f32_to_fp8_e5m2.bin",
                   x.astype(ml_dtypes.float8_e5m2).view(np.uint8), "<u1")

    # Encoding to bf16 and f16 around the rounding midpoints.
    lows = np.array(BF16_LOWS, dtype=np.uint32)
    x = f32_from_bits(((all16 << 16)[:, None] | lows[None, :]).ravel())
    total += write(out_dir, "f32_to_bf16.bin", x.astype(ml_dtypes.bfloat16).view(np.uint16), "<u2")
    his = f16_table_his()
    assert len(his) == 45 * 256
    lows = np.array(F16_LOWS, dtype=np.uint32)
    x = f32_from_bits(((his << 16)[:, None] | lows[None, :]).ravel())
    total += write(out_dir, "f32_to_f16.bin", x.astype(np.float16).view(np.uint16), "<u2")
  print(f"total: {total} bytes")


if __name__ == "__main__":
  main()
