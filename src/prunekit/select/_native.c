/* The selection's one pass over a chunk of scores, as one loop (prunekit.select); the
   k-th smallest of the few entries it gathers; their marking once that is known.

For each entry: its magnitude (or, for scores ranked by signed value, the score itself); whether it competes (its alive flag); whether it
is below `lower` (counted); whether it lies in [lower, upper] (then its position
and magnitude are gathered, to be ranked by the caller); whether it is finite.
The selection is written as one of two bit patterns per entry: chosen below
`mid`, the caller's best guess of the k-th smallest; `settle` then rewrites the
gathered entries that guess got wrong. The scores are read once, where the same
work as tensor operations reads them about ten times.

No Python object is touched while a loop runs, so it releases the GIL: threads
can work on parts of a chunk at once. Addresses come in as integers from
Tensor.data_ptr(); the caller owns and checks every buffer (native.py).

Plain C99 and Python's C API: any C99 compiler builds it. Where the compiler has
them, it uses __builtin_ctzll and, on x86-64 with glibc, target_clones (GCC 6 and
later, Clang 14 and later); elsewhere portable code takes their place. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Entries handled per inner loop: their in-between flags fit in L1. */
#define BLOCK 2048

/* On x86-64 with glibc, where the compiler has target_clones (GCC 6+, Clang 14+), build
   the loops for AVX-512, AVX2 and the baseline, and pick one when the module loads
   (measured here: about 0.7 and 0.8 of the baseline's time). The clones need glibc's
   ifunc; other compilers and C libraries build the baseline only. */
#if defined(__has_attribute)
#if __has_attribute(target_clones) && defined(__x86_64__) && defined(__GLIBC__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef CLONES
#define CLONES
#endif

/* Writes the indices of the non-zero bytes of flags[0, len) into `at`, in order; returns
   how many. Few are set: the flags are skipped eight at a time, and where the compiler
   counts trailing zeros and bytes are little-endian, a word's set bytes are found from
   its bits. */
static Py_ssize_t set_bytes(const uint8_t *flags, Py_ssize_t len, Py_ssize_t *at) {
    Py_ssize_t m = 0;
    for (Py_ssize_t w = 0; w < len; w += 8) {
        const Py_ssize_t width = len - w < 8 ? len - w : 8;
        uint64_t word = 0;
        memcpy(&word, flags + w, (size_t)width);
        if (!word) continue;
#if (defined(__GNUC__) || defined(__clang__)) && defined(__BYTE_ORDER__) && \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        for (; word; word &= word - 1) at[m++] = w + (__builtin_ctzll(word) >> 3);
#else
        for (Py_ssize_t i = w; i < w + width; i++)
            if (flags[i]) at[m++] = i;
#endif
    }
    return m;
}

typedef struct {
    Py_ssize_t below;     /* competing entries below `lower` */
    Py_ssize_t found;     /* competing entries in [lower, upper], gathered */
    Py_ssize_t competing; /* entries whose alive flag is set (all, without flags) */
    int finite;           /* every magnitude finite, competing or not */
} Tally;

/* Each pairing of a score type with an output width the loops are built for, as
   X(suffix, score type, its fabs, its largest finite value, output type). */
#define EACH_PAIRING(X)                              \
    X(f4_o1, float, fabsf, FLT_MAX, uint8_t)         \
    X(f4_o2, float, fabsf, FLT_MAX, uint16_t)        \
    X(f4_o4, float, fabsf, FLT_MAX, uint32_t)        \
    X(f4_o8, float, fabsf, FLT_MAX, uint64_t)        \
    X(f8_o1, double, fabs, DBL_MAX, uint8_t)         \
    X(f8_o2, double, fabs, DBL_MAX, uint16_t)        \
    X(f8_o4, double, fabs, DBL_MAX, uint32_t)        \
    X(f8_o8, double, fabs, DBL_MAX, uint64_t)

/* RUN(suffix, score type, output type) for the pairing of `kind` (bytes per score, 4
   or 8) and `width` (bytes per output entry, 1, 2, 4 or 8), both checked before. */
#define DISPATCH(RUN)                                          \
    do {                                                       \
        if (kind == 4) {                                       \
            switch (width) {                                   \
            case 1: RUN(f4_o1, float, uint8_t); break;         \
            case 2: RUN(f4_o2, float, uint16_t); break;        \
            case 4: RUN(f4_o4, float, uint32_t); break;        \
            default: RUN(f4_o8, float, uint64_t); break;       \
            }                                                  \
        } else {                                               \
            switch (width) {                                   \
            case 1: RUN(f8_o1, double, uint8_t); break;        \
            case 2: RUN(f8_o2, double, uint16_t); break;       \
            case 4: RUN(f8_o4, double, uint32_t); break;       \
            default: RUN(f8_o8, double, uint64_t); break;      \
            }                                                  \
        }                                                      \
    } while (0)

/* One loop per score type S, output type O, whether alive flags are read and whether
   a product is written: `orig` with the magnitude cleared (the sign kept, as 0 * orig
   keeps it) where chosen. Entries below `mid` (in [lower, upper]: the best guess of the
   k-th smallest) are written as chosen, so that settling the gathered ones afterwards
   changes few of them. With `sign`, the scores themselves are compared and gathered
   instead of their magnitudes (a test the compiler hoists out of the loop). */
#define SPLIT(NAME, S, ABS, MAX, O, A, ALIVE, PRODUCT)                                       \
    static CLONES void NAME(const S *scores, const A *alive, A one, O *out, O chosen,      \
                            O other, const O *orig, O *product, Py_ssize_t n, S lower,     \
                            S mid, S upper, int64_t *positions, S *values, int64_t base,   \
                            int sign, Tally *tally) {                                      \
        const O flip = chosen ^ other;                                                     \
        const O magnitude = (O)(((O)-1) >> 1); /* every bit but the sign */               \
        uint8_t between[BLOCK];                                                            \
        Py_ssize_t at[BLOCK];                                                              \
        for (Py_ssize_t start = 0; start < n; start += BLOCK) {                            \
            const Py_ssize_t len = n - start < BLOCK ? n - start : BLOCK;                  \
            const S *x = scores + start;                                                   \
            O *o = out + start;                                                            \
            int32_t lows = 0, band = 0, live = 0, bad = 0;                                 \
            for (Py_ssize_t i = 0; i < len; i++) {                                         \
                const S m = ABS(x[i]);                                                     \
                const S a = sign ? x[i] : m;                                               \
                const int32_t on = ALIVE ? (alive[start + i] == one) : 1;                  \
                const int32_t low = on & (a < lower);                                      \
                const int32_t in = on & (a >= lower) & (a <= upper);                       \
                const O mark = (O)(-(O)(on & (a < mid)));                                  \
                o[i] = other ^ (flip & mark);                                              \
                if (PRODUCT) product[start + i] = orig[start + i] & (O)~(magnitude & mark); \
                lows += low;                                                               \
                band += in;                                                                \
                live += on;                                                                \
                bad |= !(m <= MAX);                                                        \
                between[i] = (uint8_t)in;                                                  \
            }                                                                              \
            tally->below += lows;                                                          \
            tally->competing += live;                                                      \
            tally->finite &= !bad;                                                         \
            if (!band) continue;                                                           \
            const Py_ssize_t found = set_bytes(between, len, at);                          \
            for (Py_ssize_t j = 0; j < found; j++) {                                       \
                positions[tally->found + j] = base + start + at[j];                        \
                values[tally->found + j] = sign ? x[at[j]] : ABS(x[at[j]]);                \
            }                                                                              \
            tally->found += found;                                                         \
        }                                                                                  \
    }

/* Alive flags of 1, 2, 4 or 8 bytes: an entry competes where its flag's bits are `one`'s
   (a bool's True, or 1 in a mask of any real dtype). */
#define SPLITS(SUFFIX, S, ABS, MAX, O)                                     \
    SPLIT(split_##SUFFIX, S, ABS, MAX, O, uint8_t, 0, 0)                  \
    SPLIT(split_alive1_##SUFFIX, S, ABS, MAX, O, uint8_t, 1, 0)           \
    SPLIT(split_alive2_##SUFFIX, S, ABS, MAX, O, uint16_t, 1, 0)          \
    SPLIT(split_alive4_##SUFFIX, S, ABS, MAX, O, uint32_t, 1, 0)          \
    SPLIT(split_alive8_##SUFFIX, S, ABS, MAX, O, uint64_t, 1, 0)          \
    SPLIT(split_product_##SUFFIX, S, ABS, MAX, O, uint8_t, 0, 1)

EACH_PAIRING(SPLITS)

#define CALL(SUFFIX, S, O)                                                                 \
    do {                                                                                   \
        const S *x = (const S *)scores;                                                    \
        O *o = (O *)out;                                                                   \
        const O *src = (const O *)orig;                                                    \
        S *v = (S *)values;                                                                \
        switch (alive ? alive_width : 0) {                                                 \
        case 0:                                                                            \
            if (product)                                                                   \
                split_product_##SUFFIX(x, NULL, 0, o, (O)chosen, (O)other, src, (O *)product, \
                                       n, (S)lower, (S)mid, (S)upper, positions, v, base,  \
                                       sign, &tally);                                            \
            else                                                                           \
                split_##SUFFIX(x, NULL, 0, o, (O)chosen, (O)other, NULL, NULL, n, (S)lower, \
                               (S)mid, (S)upper, positions, v, base, sign, &tally);        \
            break;                                                                         \
        case 1:                                                                            \
            split_alive1_##SUFFIX(x, (const uint8_t *)alive, (uint8_t)alive_one, o,        \
                                  (O)chosen, (O)other, NULL, NULL, n, (S)lower, (S)mid,    \
                                  (S)upper, positions, v, base, sign, &tally);             \
            break;                                                                         \
        case 2:                                                                            \
            split_alive2_##SUFFIX(x, (const uint16_t *)alive, (uint16_t)alive_one, o,      \
                                  (O)chosen, (O)other, NULL, NULL, n, (S)lower, (S)mid,    \
                                  (S)upper, positions, v, base, sign, &tally);             \
            break;                                                                         \
        case 4:                                                                            \
            split_alive4_##SUFFIX(x, (const uint32_t *)alive, (uint32_t)alive_one, o,      \
                                  (O)chosen, (O)other, NULL, NULL, n, (S)lower, (S)mid,    \
                                  (S)upper, positions, v, base, sign, &tally);             \
            break;                                                                         \
        default:                                                                           \
            split_alive8_##SUFFIX(x, (const uint64_t *)alive, (uint64_t)alive_one, o,      \
                                  (O)chosen, (O)other, NULL, NULL, n, (S)lower, (S)mid,    \
                                  (S)upper, positions, v, base, sign, &tally);             \
            break;                                                                         \
        }                                                                                  \
    } while (0)

static PyObject *split(PyObject *self, PyObject *args) {
    unsigned long long scores_at, alive_at, out_at, positions_at, values_at, orig_at, product_at;
    unsigned long long chosen, other, alive_one;
    int kind, width, alive_width;
    Py_ssize_t n;
    double lower, mid, upper;
    long long base;
    int sign = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "KiKiKKiKKKKndddKKL|p", &scores_at, &kind, &alive_at,
                          &alive_width, &alive_one, &out_at, &width, &chosen, &other, &orig_at,
                          &product_at, &n, &lower, &mid, &upper, &positions_at, &values_at,
                          &base, &sign))
        return NULL;
#define WIDTH_OK(w) ((w) == 1 || (w) == 2 || (w) == 4 || (w) == 8)
    if ((kind != 4 && kind != 8) || !WIDTH_OK(width) || (alive_at && !WIDTH_OK(alive_width)) ||
        n < 0 || (product_at && (alive_at || !orig_at))) {
        PyErr_Format(PyExc_ValueError,
                     "split: scores of %d bytes, output of %d bytes, flags of %d bytes, %zd "
                     "entries, product %s; expected 4 or 8, 1, 2, 4 or 8, 1, 2, 4 or 8, a "
                     "count >= 0, and a product only from an orig and without alive flags",
                     kind, width, alive_width, n, product_at ? "asked" : "not asked");
        return NULL;
    }
    const void *scores = (const void *)(uintptr_t)scores_at;
    const void *alive = (const void *)(uintptr_t)alive_at;
    void *out = (void *)(uintptr_t)out_at;
    int64_t *positions = (int64_t *)(uintptr_t)positions_at;
    void *values = (void *)(uintptr_t)values_at;
    const void *orig = (const void *)(uintptr_t)orig_at;
    void *product = (void *)(uintptr_t)product_at;
    Tally tally = {0, 0, 0, 1};
    Py_BEGIN_ALLOW_THREADS
    DISPATCH(CALL);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("nnnO", tally.below, tally.found, tally.competing,
                         tally.finite ? Py_True : Py_False);
}

/* The gathered entries of one tensor, in order: chosen if their magnitude is below the
   k-th smallest, or equal to it while `take` lasts (ties go to the earlier entry). The
   one pass wrote those below `mid` as chosen; only the entries that differ are written
   again (out, and the product's magnitude: cleared or restored). Returns what `take`
   is left. */
#define SETTLE(NAME, S, O)                                                                \
    static Py_ssize_t NAME(O *out, O chosen, O other, const O *orig, O *product,          \
                           const int64_t *positions, const S *values, Py_ssize_t count,   \
                           S kth, S mid, Py_ssize_t take) {                               \
        const O magnitude = (O)(((O)-1) >> 1);                                            \
        for (Py_ssize_t i = 0; i < count; i++) {                                          \
            const S value = values[i];                                                    \
            const int tie = value == kth && take > 0;                                     \
            const int pick = value < kth || tie;                                          \
            take -= tie;                                                                  \
            if (pick == (value < mid)) continue;                                          \
            const int64_t at = positions[i];                                              \
            out[at] = pick ? chosen : other;                                              \
            if (product) product[at] = pick ? orig[at] & (O)~magnitude : orig[at];        \
        }                                                                                 \
        return take;                                                                      \
    }

#define SETTLES(SUFFIX, S, ABS, MAX, O) SETTLE(settle_##SUFFIX, S, O)
EACH_PAIRING(SETTLES)

#define SETTLE_CALL(SUFFIX, S, O)                                                          \
    take = settle_##SUFFIX((O *)out, (O)chosen, (O)other, (const O *)orig, (O *)product,  \
                           positions, (const S *)values, count, (S)kth, (S)mid, take)

static PyObject *settle(PyObject *self, PyObject *args) {
    unsigned long long out_at, orig_at, product_at, positions_at, values_at, chosen, other;
    int kind, width;
    Py_ssize_t count, take;
    double kth, mid;
    (void)self;
    if (!PyArg_ParseTuple(args, "KiKKKKKKinddn", &out_at, &width, &chosen, &other, &orig_at,
                          &product_at, &positions_at, &values_at, &kind, &count, &kth, &mid,
                          &take))
        return NULL;
    if ((kind != 4 && kind != 8) || (width != 1 && width != 2 && width != 4 && width != 8) ||
        count < 0 || take < 0 || (product_at && !orig_at)) {
        PyErr_Format(PyExc_ValueError,
                     "settle: values of %d bytes, output of %d bytes, %zd entries, %zd ties to "
                     "take; expected 4 or 8, 1, 2, 4 or 8, counts >= 0, and a product only "
                     "from an orig",
                     kind, width, count, take);
        return NULL;
    }
    void *out = (void *)(uintptr_t)out_at;
    const void *orig = (const void *)(uintptr_t)orig_at;
    void *product = (void *)(uintptr_t)product_at;
    const int64_t *positions = (const int64_t *)(uintptr_t)positions_at;
    const void *values = (const void *)(uintptr_t)values_at;
    Py_BEGIN_ALLOW_THREADS
    DISPATCH(SETTLE_CALL);
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(take);
}

/* The k-th smallest (0-based) of n values, found in place by quickselect: a three-way
   partition around a pseudo-random pivot, so runs of ties cost no more than distinct
   values. The values hold no NaN. */
#define KTH(NAME, S)                                                                      \
    static S NAME(S *a, Py_ssize_t n, Py_ssize_t k) {                                     \
        Py_ssize_t lo = 0, hi = n - 1;                                                    \
        uint64_t seed = 0x9E3779B97F4A7C15ull;                                            \
        while (lo < hi) {                                                                 \
            seed ^= seed << 13;                                                           \
            seed ^= seed >> 7;                                                            \
            seed ^= seed << 17;                                                           \
            const S pivot = a[lo + (Py_ssize_t)(seed % (uint64_t)(hi - lo + 1))];         \
            Py_ssize_t less = lo, i = lo, more = hi;                                      \
            while (i <= more) {                                                           \
                const S v = a[i];                                                         \
                if (v < pivot) {                                                          \
                    a[i++] = a[less];                                                     \
                    a[less++] = v;                                                        \
                } else if (v > pivot) {                                                   \
                    a[i] = a[more];                                                       \
                    a[more--] = v;                                                        \
                } else {                                                                  \
                    i++;                                                                  \
                }                                                                         \
            }                                                                             \
            if (k < less) hi = less - 1;                                                  \
            else if (k > more) lo = more + 1;                                             \
            else return pivot;                                                            \
        }                                                                                 \
        return a[k];                                                                      \
    }

KTH(kth_f4, float)
KTH(kth_f8, double)

/* The same without touching the values: non-negative floats order like their bits, so a
   histogram of the bits' top 16 above the smallest's finds the bucket holding the k-th,
   whose few values are copied out and quickselected. Two reads of the values, no copy
   of them all. */
#define BUCKETS (1 << 16)
#define KTH_HIST(NAME, S, K, QUICK)                                                        \
    static int NAME(const S *values, Py_ssize_t n, Py_ssize_t k, S *result) {              \
        K low = (K)-1, high = 0;                                                           \
        for (Py_ssize_t i = 0; i < n; i++) {                                               \
            K bits;                                                                        \
            memcpy(&bits, values + i, sizeof bits);                                        \
            low = bits < low ? bits : low;                                                 \
            high = bits > high ? bits : high;                                              \
        }                                                                                  \
        int shift = 0;                                                                     \
        while (((high - low) >> shift) >= BUCKETS) shift++;                                \
        Py_ssize_t *counts = calloc(BUCKETS, sizeof *counts);                              \
        if (!counts) return -1;                                                            \
        for (Py_ssize_t i = 0; i < n; i++) {                                               \
            K bits;                                                                        \
            memcpy(&bits, values + i, sizeof bits);                                        \
            counts[(bits - low) >> shift]++;                                               \
        }                                                                                  \
        Py_ssize_t bucket = 0, before = 0;                                                 \
        while (before + counts[bucket] <= k) before += counts[bucket++];                   \
        const Py_ssize_t size = counts[bucket];                                            \
        free(counts);                                                                      \
        S *few = malloc((size_t)size * sizeof *few);                                       \
        if (!few) return -1;                                                               \
        Py_ssize_t m = 0;                                                                  \
        for (Py_ssize_t i = 0; i < n; i++) {                                               \
            K bits;                                                                        \
            memcpy(&bits, values + i, sizeof bits);                                        \
            if ((Py_ssize_t)((bits - low) >> shift) == bucket) few[m++] = values[i];       \
        }                                                                                  \
        *result = QUICK(few, size, k - before);                                            \
        free(few);                                                                         \
        return 0;                                                                          \
    }

KTH_HIST(kth_hist_f4, float, uint32_t, kth_f4)
KTH_HIST(kth_hist_f8, double, uint64_t, kth_f8)

static PyObject *kth(PyObject *self, PyObject *args) {
    unsigned long long values_at;
    int kind;
    Py_ssize_t n, k;
    double result;
    (void)self;
    if (!PyArg_ParseTuple(args, "Kinn", &values_at, &kind, &n, &k)) return NULL;
    if ((kind != 4 && kind != 8) || k < 0 || k >= n) {
        PyErr_Format(PyExc_ValueError,
                     "kth: values of %d bytes, k=%zd of %zd; expected 4 or 8 and 0 <= k < n",
                     kind, k, n);
        return NULL;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    if (kind == 4) {
        float found = 0;
        failed = kth_hist_f4((const float *)(uintptr_t)values_at, n, k, &found);
        result = found;
    } else {
        failed = kth_hist_f8((const double *)(uintptr_t)values_at, n, k, &result);
    }
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    return PyFloat_FromDouble(result);
}

static PyMethodDef methods[] = {
    {"split", split, METH_VARARGS,
     "split(scores, kind, alive, alive_width, alive_one, out, width, chosen, other, orig, "
     "product, n, lower, mid, upper, positions, values, base, signed=False) -> (below, found, "
     "competing, finite)\n\n"
     "One pass over n scores (float of `kind` bytes) at the given addresses; see _native.c."},
    {"settle", settle, METH_VARARGS,
     "settle(out, width, chosen, other, orig, product, positions, values, kind, count, kth, "
     "mid, take) -> take left\n\n"
     "Marks the gathered entries at or below the k-th smallest magnitude; see _native.c."},
    {"kth", kth, METH_VARARGS,
     "kth(values, kind, n, k) -> the k-th smallest (0-based) of n non-negative values"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "prunekit.select._native",
                                    "The selection's one pass as a single loop (see native.py).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
