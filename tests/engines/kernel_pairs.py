"""The (store dtype, output dtype) pairs the fused CPU kernel is tested with: each is a kernel of its own
that numba compiles in ~6 s on the 2-core VM.

The bit-for-bit test covers the pairs where the code differs instead of all 40: every store dtype into
float32 (its conversion to the float32 compute type, shared by both 16-bit outputs) and into bfloat16 (the
register blocks' vector conversion and rounding, and the NaN test that integer stores skip); float16 takes
the same blocks with a conversion to half in place of the bfloat16 rounding, from an unsigned and a signed
integer store (no NaN test) and a float store (the NaN test); float64 computes in float64, so it takes one
store of each kind of conversion (sign or zero extension, and the rounding that 64-bit integers need).
test_engines_agree_bit_for_bit uses the same float16 / float64 stores.
"""

STORE_DTYPES = ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"]
OUT_DTYPES = ["float32", "float16", "bfloat16", "float64"]
FLOAT16_STORES = ["uint16", "int16", "float32"]
FLOAT64_STORES = ["uint8", "int16", "uint16", "uint32", "float32", "float64", "int64", "uint64"]
CUT_PAIRS = [(s, o) for o in ("float32", "bfloat16") for s in STORE_DTYPES] + [
    (s, "float16") for s in FLOAT16_STORES] + [(s, "float64") for s in FLOAT64_STORES]
