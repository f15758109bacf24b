"""The residual term of calibrate's prediction interval, from held-out residuals of the fit.

The Laplace interval of `calibrate.prediction_interval` adds the parameter uncertainty
j Sigma j^T to a residual variance. Taking that variance from the fitted rows' own residuals,
s^2 = sum r^2 / (n - k), assumes Gaussian errors the fit has seen; the model's errors are
heavier-tailed than that (vTrain single-node: the 95th percentile of |r| is 0.177, 1.96 s is
0.150) and grow off the fitted domain (multi-node rows predicted from single-node rows), so
the interval covered 80.7 % of those rows instead of 95 %. Here the residual term is the
95 % quantile of the fitted rows' *held-out* (leave-one-out) residuals instead: the
jackknife+ / split-conformal construction (Barber, Candes, Ramdas & Tibshirani 2021,
"Predictive inference with the jackknife+", Ann. Statist. 49(1); Vovk et al. 2005), which
covers 95 % of new rows that resemble the fitted ones, whatever the error distribution.
Leave-one-out residuals come from the Gauss-Newton hat matrix of the fit, no refits.
"""

from __future__ import annotations

import math

import numpy as np


def ridge_precision(jacobian_fit, prior_precision):
    """A = J^T J + n diag(lambda): the Gauss-Newton precision of the prior-regularised fit
    (`loo_residuals`), in float64 whatever J's dtype. `calibrate.calibrate_runs` builds it
    once for the Laplace covariance (Sigma = s^2 A^-1) and the leave-one-out residuals.
    Example: J = (1, 1, 1, 1)^T, lambda = 0: A = [[4]]."""
    J = np.asarray(jacobian_fit, float)
    return J.T @ J + J.shape[0] * np.diag(np.asarray(prior_precision, float))


def loo_residuals(jacobian_fit, residuals_fit, prior_precision, precision=None):
    """Leave-one-out residuals of the linearised, prior-regularised least-squares fit:

        r_(i) = r_i / (1 - h_ii),   h_ii = j_i (J^T J + n diag(lambda))^-1 j_i^T

    J = d log T / d u on the n fitted rows (one column per fitted field), r = log predicted -
    log measured, lambda = the prior strengths of `calibrate.fit` (`prior_precision`, one per
    column; the mean-squared loss plus lambda (u - u0)^2 is the ridge problem
    sum r^2 + n lambda (u - u0)^2). Exact for ridge regression, where removing row i changes
    the fit by the rank-one update that this formula sums up (Allen 1974, "The relationship
    between variable selection and data augmentation and a method for prediction",
    Technometrics 16 (PRESS); Golub, Heath & Wahba 1979, Technometrics 21, Section 2).
    Example: one column j = (1, 1, 1, 1), lambda = 0, r = (1, -1, 1, -1) / 10: h_ii = 1/4,
    r_(i) = r_i / 0.75. `precision`: A when the caller has it (`ridge_precision`), else built.
    """
    J = np.asarray(jacobian_fit, float)
    r = np.asarray(residuals_fit, float)
    A = ridge_precision(J, prior_precision) if precision is None else precision
    h = np.einsum("ij,ji->i", J, np.linalg.solve(A, J.T))
    # h_ii < 1 whenever the prior is positive; the clip only guards a singular A.
    return r / np.clip(1.0 - h, 1e-6, None)


def conformal_quantile(abs_residuals, coverage=0.95):
    """The ceil((n + 1) c)-th smallest of n held-out |residuals| (the largest when n is too
    small for that rank): a new exchangeable row's |residual| exceeds it with probability at
    most 1 - c (split-conformal rank; Vovk et al. 2005, Lei et al. 2018 JASA 113, Section 2.2).
    Example: |r| = 0.01, 0.02, ..., 0.99 (n = 99), c = 0.95: rank 95, 0.95.
    """
    x = np.sort(np.asarray(abs_residuals, float))
    k = min(math.ceil((len(x) + 1) * coverage), len(x))
    return float(x[k - 1])


def residual_var(jacobian_fit, residuals_fit, prior_precision, coverage=0.95, z=1.96,
                 precision=None):
    """Residual variance of the prediction interval, (q / z)^2 with q = `conformal_quantile`
    of the leave-one-out |residuals| (`loo_residuals`, given A as `precision` or not): a row
    with no parameter uncertainty gets the interval +-q, which holds the fraction `coverage`
    of held-out fitted rows.
    Example: q = 0.177 (vTrain single-node rows), z = 1.96: (0.0903)^2 = 0.00816.
    """
    q = conformal_quantile(np.abs(loo_residuals(jacobian_fit, residuals_fit, prior_precision,
                                                precision)), coverage)
    return (q / z) ** 2
