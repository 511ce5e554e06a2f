/* The comparison kernel in C: the per-block rows of verify/scan_numba.py's numba kernel (the
   same columns, the same arithmetic), for a C compiler instead of numba. verify/scan_native.py
   builds it on first use with the flags it names and loads it through ctypes.

   Each block's values are read once, in float64: |a-r| and |r| with their maxima, the largest
   relative error, the count above atol + rtol*|r| (not contracted into a fused multiply-add, so
   counts agree with numpy's), the tolerance units, and the sums for mean error, cosine and SQNR.
   Every value is assumed finite, as the numba kernel does: a block holding NaN or Inf gives a
   non-finite SAA + SRR, and the caller redoes it in numpy. The caller never hands it an
   infinite atol or rtol (verify/scan_native.py's native_fill). */
#include <stdint.h>

/* GCC turns the maxima below into vector max instructions only when it may assume no NaN and
   no infinity (3 GB/s scalar, 11 vectorized). That holds for every block whose row is kept,
   and GCC makes no use of it to change a NaN's way through the sums, so a block holding one is
   still found. Clang is not asked: under its fast-math flags a NaN would be poison, and no
   guarantee is left that the sums show it. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize ("finite-math-only")
#endif

enum { MAXD, PEAK, MAXREL, MAXTR, SD, SDD, SAA, SRR, NV, NCMP, NCOL = 15 };
#define DEN_MIN 2.2250738585072014e-308

#define BLOCK(NAME, T, WANT_TR)                                                            \
static void NAME(const T *restrict av, const T *restrict rv, int64_t m, double atol,      \
                 double rtol, double tiny, double *restrict row) {                         \
    double maxd = 0, peak = 0, mrel = 0, mtr = 0, sd = 0, sdd = 0, saa = 0, srr = 0;       \
    double nv = 0;                                                                         \
    for (int64_t i = 0; i < m; i++) {                                                      \
        double x = (double)av[i], y = (double)rv[i];                                       \
        double d = __builtin_fabs(x - y);                                                  \
        double ay = __builtin_fabs(y);                                                     \
        maxd = d > maxd ? d : maxd;                                                        \
        peak = ay > peak ? ay : peak;                                                      \
        double q = d / (ay > tiny ? ay : tiny);                                            \
        mrel = q > mrel ? q : mrel;                                                        \
        double den = atol + rtol * ay;                                                     \
        nv += d > den ? 1.0 : 0.0;                                                         \
        if (WANT_TR) {                                                                     \
            double t = d / (den > DEN_MIN ? den : DEN_MIN);                                \
            mtr = t > mtr ? t : mtr;                                                       \
        }                                                                                  \
        sd += d; sdd += d * d; saa += x * x; srr += y * y;                                 \
    }                                                                                      \
    row[MAXD] = maxd; row[PEAK] = peak; row[MAXREL] = mrel; row[MAXTR] = mtr;              \
    row[SD] = sd; row[SDD] = sdd; row[SAA] = saa; row[SRR] = srr;                          \
    row[NV] = nv; row[NCMP] = (double)m;                                                   \
}

#define ROWS(NAME, T)                                                                      \
BLOCK(NAME##_plain, T, 0)                                                                  \
BLOCK(NAME##_tr, T, 1)                                                                     \
void NAME(const T *a, const T *r, const int64_t *starts, const int64_t *stops, int64_t n, \
          double atol, double rtol, double tiny, int want_tr, double *out) {              \
    for (int64_t j = 0; j < n; j++) {                                                      \
        int64_t lo = starts[j], m = stops[j] - lo;                                         \
        if (want_tr) NAME##_tr(a + lo, r + lo, m, atol, rtol, tiny, out + j * NCOL);       \
        else NAME##_plain(a + lo, r + lo, m, atol, rtol, tiny, out + j * NCOL);            \
    }                                                                                      \
}

ROWS(verify_rows_f32, float)
ROWS(verify_rows_f64, double)
