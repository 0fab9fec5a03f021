"""The (store dtype, output dtype) pairs the fused CPU kernel is tested with: each is a kernel of its own
that numba compiles in ~6-10 s on the 2-core VM.

The bit-for-bit test covers the pairs where the code differs instead of all 40: every store dtype into
float32 (its load and conversion to the float32 compute type, which both 16-bit outputs share, in the
register blocks and in the per-row path); bfloat16 and float16 (each its own rounding after that
conversion) from an unsigned and a signed integer store (no NaN test) and two float stores (the NaN
test); float64 computes in float64, so it takes one store of each kind of conversion (sign or zero
extension, and the rounding that 64-bit integers need). test_engines_agree_bit_for_bit uses the same
16-bit stores. Normalized tiles (normalize_tile, then copy_patches) are tested from an unsigned and a signed
integer store (the conversion to float32) and a float store (twice the bytes per value, NaN), each into
both 16-bit outputs (their vector and scalar roundings).
"""

STORE_DTYPES = ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"]
OUT_DTYPES = ["float32", "float16", "bfloat16", "float64"]
FLOAT16_STORES = ["uint16", "int16", "float32", "float64"]  # the stores of both 16-bit outputs
FLOAT64_STORES = ["uint8", "int16", "uint16", "uint32", "float32", "float64", "int64", "uint64"]
CUT_PAIRS = [(s, "float32") for s in STORE_DTYPES] + [
    (s, o) for o in ("bfloat16", "float16") for s in FLOAT16_STORES] + [(s, "float64") for s in FLOAT64_STORES]
NORMALIZED_PAIRS = [(s, o) for s in ("uint16", "int16", "float32") for o in ("bfloat16", "float16")]
