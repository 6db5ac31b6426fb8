/*
 * Percentiles shared by `echo-bench serve` (its summary) and the tests,
 * which recompute the same definition from the saved JSON in Python.
 */
#include <math.h>

#include "tools/bench/bench.h"

double bench_percentile(const double *sorted, size_t n, double p) {
    if (n == 1) return sorted[0];
    double pos = (double)(n - 1) * p / 100.0;
    size_t k = (size_t)floor(pos);
    if (k >= n - 1) return sorted[n - 1];
    double frac = pos - (double)k;
    return sorted[k] + (sorted[k + 1] - sorted[k]) * frac;
}
