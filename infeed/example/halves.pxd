# cython: language_level=3
"""float32 to bfloat16 and float16, rounded to nearest even: the decoder's and the image kernel's casts."""

from libc.stdint cimport uint16_t, uint32_t
from libc.string cimport memcpy


cdef inline uint16_t bfloat16_bits(uint32_t x) noexcept nogil:
    """The bfloat16 nearest the float32 of bits ``x`` (ties to even), as ml_dtypes casts: a value
    past bfloat16's largest finite one becomes inf, a NaN the quiet NaN of its sign."""
    if (x & 0x7fffffffu) > 0x7f800000u:
        return <uint16_t>(((x >> 16) & 0x8000u) | 0x7fc0u)
    return <uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)


cdef inline uint32_t choose(bint condition, uint32_t yes, uint32_t no) noexcept nogil:
    """``yes if condition else no``, without a branch."""
    return no ^ ((yes ^ no) & (0u - <uint32_t>condition))


cdef inline uint16_t float16_bits(uint32_t x) noexcept nogil:
    """The float16 nearest the float32 of bits ``x`` (ties to even), as numpy casts: 65520 and
    beyond become inf, below 2**-25 zero, a NaN keeps the top 10 bits of its payload (and stays a NaN).

    Every case is computed and one chosen, without branches, so that loops over it vectorise."""
    cdef uint32_t a = x & 0x7fffffffu
    cdef uint32_t payload = (a & 0x7fffffu) >> 13
    cdef uint32_t subnormal, h
    cdef float f
    # Below 2**-14, a subnormal float16 (or zero): added to 0.5f, whose ulp is their step 2**-24, the
    # value is rounded to nearest even by the FPU and the count of steps is left in the low bits.
    memcpy(&f, &a, 4)
    f += <float>0.5
    memcpy(&subnormal, &f, 4)
    subnormal -= 0x3f000000u
    # A normal float16: the exponent rebiased by 127 - 15, 13 bits rounded off (a carry goes to the exponent).
    h = choose(a >= 0x38800000u, (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13, subnormal)
    h = choose(a >= 0x477ff000u, 0x7c00u, h)
    h = choose(a > 0x7f800000u, 0x7c00u + payload + (payload == 0), h)
    return <uint16_t>(((x >> 16) & 0x8000u) | h)
