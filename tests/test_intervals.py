"""The residual term of calibrate's prediction interval (diffperf/intervals.py): leave-one-out
residuals of the linearised fit and their split-conformal quantile, checked by hand and
against explicit refits."""

import numpy as np
import pytest

from diffperf import intervals


def test_loo_residuals_docstring_example():
    # One column of ones, no prior: the fit is the mean, h_ii = 1/n = 1/4, r_(i) = r_i / 0.75.
    J = np.ones((4, 1))
    r = np.array([1.0, -1.0, 1.0, -1.0]) / 10
    got = intervals.loo_residuals(J, r, [0.0])
    np.testing.assert_allclose(got, r / (1 - 1 / 4), rtol=1e-12)


def test_loo_residuals_equal_explicit_ridge_refits():
    # Linear model y = J u + noise, loss sum r^2 + n lambda |u|^2 (u0 = 0). Refit without row i
    # (same penalty matrix) and predict row i: its residual is r_i / (1 - h_ii) exactly
    # (Allen 1974; Golub, Heath & Wahba 1979).
    rng = np.random.default_rng(0)
    n, k = 20, 3
    J = rng.standard_normal((n, k))
    y = J @ np.array([0.5, -1.0, 2.0]) + 0.1 * rng.standard_normal(n)
    lam = np.array([1e-3, 1e-2, 1e-1])
    P = n * np.diag(lam)
    u = np.linalg.solve(J.T @ J + P, J.T @ y)
    r = J @ u - y  # prediction minus measurement, the sign calibrate uses
    expected = []
    for i in range(n):
        keep = np.arange(n) != i
        u_i = np.linalg.solve(J[keep].T @ J[keep] + P, J[keep].T @ y[keep])
        expected.append(J[i] @ u_i - y[i])
    np.testing.assert_allclose(intervals.loo_residuals(J, r, lam), expected, rtol=1e-9)
    # Held-out residuals are never smaller than the fitted ones (0 <= h_ii < 1).
    assert np.all(np.abs(intervals.loo_residuals(J, r, lam)) >= np.abs(r))
    # The precision matrix built once by the caller (calibrate: for the covariance too) is the
    # one loo_residuals builds, in float64 even from a float32 Jacobian.
    A = intervals.ridge_precision(J.astype(np.float32), lam)
    assert A.dtype == np.float64
    np.testing.assert_allclose(A, J.T @ J + P, rtol=1e-6)
    A = intervals.ridge_precision(J, lam)
    np.testing.assert_array_equal(intervals.loo_residuals(J, r, lam, precision=A),
                                  intervals.loo_residuals(J, r, lam))
    np.testing.assert_array_equal(intervals.ridge_precision(np.ones((4, 1)), [0.0]), [[4.0]])


def test_conformal_quantile_docstring_example():
    x = np.arange(1, 100) / 100  # 0.01 .. 0.99, n = 99
    # rank ceil((99 + 1) 0.95) = 95 -> the 95th smallest, 0.95
    assert intervals.conformal_quantile(x, 0.95) == pytest.approx(0.95)
    # Too few rows for the rank: the largest one (never an extrapolated value).
    assert intervals.conformal_quantile([0.3, 0.1, 0.2], 0.95) == pytest.approx(0.3)


def test_residual_var_is_the_quantile_over_z_squared():
    # J = 0 (no parameter explains any row): h_ii = 0, the held-out residuals are the fitted
    # ones, and a row with no parameter uncertainty gets the interval +-q, q = 0.95 here.
    r = np.arange(1, 100) / 100 * np.where(np.arange(99) % 2, 1.0, -1.0)
    var = intervals.residual_var(np.zeros((99, 1)), r, [1.0])
    assert 1.96 * np.sqrt(var) == pytest.approx(0.95)
    # Docstring: q = 0.177, z = 1.96 -> (0.0903)^2.
    assert (0.177 / 1.96) ** 2 == pytest.approx(0.00816, rel=1e-3)


def test_interval_covers_heavy_tailed_rows_where_gaussian_s_does_not():
    # Laplace-distributed residuals (scale b): the in-sample Gaussian term 1.96 s = 1.96 sqrt(2) b
    # = 2.77 b covers 1 - exp(-2.77) = 93.7 % of new rows; the conformal term covers 95 %.
    rng = np.random.default_rng(1)
    fit, new = rng.laplace(0.0, 0.05, 2000), rng.laplace(0.0, 0.05, 20000)
    q = 1.96 * np.sqrt(intervals.residual_var(np.zeros((fit.size, 1)), fit, [1.0]))
    s = np.sqrt(np.mean(fit**2))
    assert np.mean(np.abs(new) <= q) == pytest.approx(0.95, abs=0.01)
    assert np.mean(np.abs(new) <= 1.96 * s) == pytest.approx(1 - np.exp(-1.96 * np.sqrt(2)),
                                                            abs=0.01)
    assert np.mean(np.abs(new) <= 1.96 * s) < 0.945
