/* The comparison kernel in C: the per-block rows of verify/scan_numba.py's numba kernel (the
   same columns, the same arithmetic), for a C compiler instead of numba. verify/scan_native.py
   builds it on first use with the flags it names and loads it through ctypes.

   Each block's values are read once, in float64: |a-r| and |r| with their maxima, the largest
   relative error, the count above atol + rtol*|r| (not contracted into a fused multiply-add, so
   counts agree with numpy's), the tolerance units, and the sums for mean error, cosine and SQNR.

   Every value is taken as IEEE has it: no fast-math beyond reassociating the sums (which lets
   them vectorize, as numba's reassoc does). The maxima are taken over the values' bit patterns
   as integers: every value whose maximum is kept is >= +0, where that order is the order of
   the doubles, and integer maxima vectorize where a floating-point one would need the compiler
   to assume no NaN (GCC keeps it scalar otherwise: 3 GB/s against 11; under clang's no-NaN
   assumption a NaN would be poison, and the sums need not show it). A block holding NaN or Inf
   gets a non-finite SAA + SRR, and the caller redoes it in numpy. */
#include <stdint.h>
#include <string.h>

enum { MAXD, PEAK, MAXREL, MAXTR, SD, SDD, SAA, SRR, NV, NCMP, NCOL = 15 };

static inline int64_t bits(double v) { int64_t i; memcpy(&i, &v, sizeof i); return i; }
static inline double value(int64_t i) { double v; memcpy(&v, &i, sizeof v); return v; }
#define KEEP_MAX(m, v) do { int64_t b_ = bits(v); m = b_ > m ? b_ : m; } while (0)

#define BLOCK(NAME, T, WANT_TR)                                                            \
static void NAME(const T *restrict av, const T *restrict rv, int64_t m, double atol,      \
                 double rtol, double tiny, double *restrict row) {                         \
    int64_t maxd = 0, peak = 0, mrel = 0, mtr = 0;                                         \
    double sd = 0, sdd = 0, saa = 0, srr = 0, nv = 0;                                      \
    for (int64_t i = 0; i < m; i++) {                                                      \
        double x = (double)av[i], y = (double)rv[i];                                       \
        double d = __builtin_fabs(x - y);                                                  \
        double ay = __builtin_fabs(y);                                                     \
        KEEP_MAX(maxd, d);                                                                 \
        KEEP_MAX(peak, ay);                                                                \
        KEEP_MAX(mrel, d / (ay > tiny ? ay : tiny));                                       \
        double den = atol + rtol * ay;                                                     \
        nv += d > den ? 1.0 : 0.0;                                                         \
        if (WANT_TR)                                                                       \
            KEEP_MAX(mtr, den > 0 ? d / den : d > 0 ? __builtin_inf() : 0.0);             \
        sd += d; sdd += d * d; saa += x * x; srr += y * y;                                 \
    }                                                                                      \
    row[MAXD] = value(maxd); row[PEAK] = value(peak); row[MAXREL] = value(mrel);           \
    row[MAXTR] = value(mtr);                                                               \
    row[SD] = sd; row[SDD] = sdd; row[SAA] = saa; row[SRR] = srr;                          \
    row[NV] = nv; row[NCMP] = (double)m;                                                   \
}

#define ROWS(NAME, T)                                                                      \
BLOCK(NAME##_plain, T, 0)                                                                  \
BLOCK(NAME##_tr, T, 1)                                                                     \
int NAME(const T *a, const T *r, int64_t size, const int64_t *starts,                   \
         const int64_t *stops, int64_t n, double atol, double rtol, double tiny,          \
         int want_tr, double *out) {                                                       \
    for (int64_t j = 0; j < n; j++)  /* every block inside [0, size), or nothing is read */ \
        if (starts[j] < 0 || stops[j] < starts[j] || stops[j] > size) return -1;           \
    for (int64_t j = 0; j < n; j++) {                                                      \
        int64_t lo = starts[j], m = stops[j] - lo;                                         \
        if (want_tr) NAME##_tr(a + lo, r + lo, m, atol, rtol, tiny, out + j * NCOL);       \
        else NAME##_plain(a + lo, r + lo, m, atol, rtol, tiny, out + j * NCOL);            \
    }                                                                                      \
    return 0;                                                                              \
}

ROWS(verify_rows_f32, float)
ROWS(verify_rows_f64, double)
