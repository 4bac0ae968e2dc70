/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Analytic

/-!
# Betting factors for an anytime-valid bound on a rate

A stream of requests is audited: the indicator `x ∈ {0, 1}` of each request says whether its
end-to-end divergence exceeded a threshold, and the unknown rate is `θ = P(x = 1)`. To test
`θ ≤ θ'` by betting, each request multiplies the wealth by the factor
`f(x) = 1 + λ (θ' − x)`; under any rate `θ ≥ θ'` the factor is nonnegative and its mean is at
most one, so the wealth is a nonnegative supermartingale and Ville's inequality
(`WitCert.Ledger.ville_finite_tree`) bounds the probability that it ever reaches `1/δ`. The
rates `θ'` not rejected form an anytime-valid upper confidence bound.

## Main statements

* `WitCert.Audit.bet_factor_nonneg`: for `λ ≥ 0`, `λ (1 − θ') ≤ 1` and `x ≤ 1`,
  `0 ≤ 1 + λ (θ' − x)`.
* `WitCert.Audit.bet_factor_mean_le_one`: for `θ' ≤ θ` and `λ ≥ 0`, the mean of the factor under
  Bernoulli(θ), `(1 − θ)(1 + λ θ') + θ (1 + λ (θ' − 1))`, is at most one.
* `WitCert.Audit.bet_factor_mono`: with the stake `λ = ρ/(1 − θ')`, the factor is nondecreasing
  in `θ'`, division-free form: `(1 − θ'₂)(1 − θ'₁ + ρ (θ'₁ − x)) ≤
  (1 − θ'₁)(1 − θ'₂ + ρ (θ'₂ − x))` for `θ'₁ ≤ θ'₂`, `ρ ≥ 0`, `x ≤ 1`;
  `WitCert.Audit.bet_factor_mono_div`: the same with the quotients, for `θ'₂ < 1`. So the set of
  rejected rates is closed downwards, and the bound is the least rate not rejected.
* `WitCert.Audit.mixture_mean_le_one`: a weighted average (weights `w_i ≥ 0` summing to one) of
  factors whose means are at most one has mean at most one.

## Implementation notes

The carrier `α` is that of `WitCert.Analytic` (core's ordered-field classes); `Rat`, the carrier
of `WitCert.Ledger`, is one. Means are finite sums `Σ_x p_x f(x)` over a list of outcomes, as in
`WitCert.Analytic.lsum`. The hypotheses are the ones the proofs use: the mean bound needs only
`θ' ≤ θ` and `λ ≥ 0`, the monotonicity only `x ≤ 1`.
-/

@[expose] public section

namespace WitCert.Audit

open WitCert.Analytic

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- The betting factor is nonnegative: for `λ ≥ 0` with `λ (1 − θ') ≤ 1` and an outcome
`x ≤ 1` (in particular `x ∈ {0, 1}`), `0 ≤ 1 + λ (θ' − x)`. -/
theorem bet_factor_nonneg {θ' lam x : α} (hlam : 0 ≤ lam) (hmax : lam * (1 - θ') ≤ 1)
    (hx : x ≤ 1) : 0 ≤ 1 + lam * (θ' - x) := by
  have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (show θ' - 1 ≤ θ' - x by grind) hlam
  grind

/-- The mean of the betting factor under Bernoulli(θ) is at most one when `θ' ≤ θ` and
`λ ≥ 0`: `(1 − θ)(1 + λ θ') + θ (1 + λ (θ' − 1)) = 1 − λ (θ − θ') ≤ 1`. -/
theorem bet_factor_mean_le_one {θ θ' lam : α} (hθ : θ' ≤ θ) (hlam : 0 ≤ lam) :
    (1 - θ) * (1 + lam * θ') + θ * (1 + lam * (θ' - 1)) ≤ 1 := by
  have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hθ hlam
  grind

/-- With the stake `λ = ρ/(1 − θ')`, the factor `1 + λ (θ' − x)` is nondecreasing in `θ'`,
division-free form: for `θ'₁ ≤ θ'₂`, `ρ ≥ 0` and `x ≤ 1`,
`(1 − θ'₂)(1 − θ'₁ + ρ (θ'₁ − x)) ≤ (1 − θ'₁)(1 − θ'₂ + ρ (θ'₂ − x))`; the difference is
`ρ (θ'₂ − θ'₁)(1 − x)`. -/
theorem bet_factor_mono {θ₁ θ₂ ρ x : α} (h12 : θ₁ ≤ θ₂) (hρ : 0 ≤ ρ) (hx : x ≤ 1) :
    (1 - θ₂) * (1 - θ₁ + ρ * (θ₁ - x)) ≤ (1 - θ₁) * (1 - θ₂ + ρ * (θ₂ - x)) := by
  have h := Lean.Grind.OrderedRing.mul_nonneg hρ
    (Lean.Grind.OrderedRing.mul_nonneg (show 0 ≤ θ₂ - θ₁ by grind) (show 0 ≤ 1 - x by grind))
  grind

/-- The monotonicity of `bet_factor_mono` with the quotients: for `θ'₁ ≤ θ'₂ < 1`, `ρ ≥ 0` and
`x ≤ 1`, `1 + ρ/(1 − θ'₁) · (θ'₁ − x) ≤ 1 + ρ/(1 − θ'₂) · (θ'₂ − x)`. -/
theorem bet_factor_mono_div {θ₁ θ₂ ρ x : α} (h12 : θ₁ ≤ θ₂) (h2 : θ₂ < 1) (hρ : 0 ≤ ρ)
    (hx : x ≤ 1) : 1 + ρ / (1 - θ₁) * (θ₁ - x) ≤ 1 + ρ / (1 - θ₂) * (θ₂ - x) := by
  have hu1 := inv_pos_of_pos (show 0 < 1 - θ₁ by grind)
  have hu2 := inv_pos_of_pos (show 0 < 1 - θ₂ by grind)
  have e1 : (1 - θ₁) * (1 - θ₁)⁻¹ = 1 := by grind
  have e2 : (1 - θ₂) * (1 - θ₂)⁻¹ = 1 := by grind
  have k := Lean.Grind.OrderedRing.mul_nonneg hρ
    (Lean.Grind.OrderedRing.mul_nonneg (show 0 ≤ θ₂ - θ₁ by grind) (show 0 ≤ 1 - x by grind))
  have k2 := Lean.Grind.OrderedRing.mul_nonneg k
    (Lean.Grind.OrderedRing.mul_nonneg (Std.le_of_lt hu1) (Std.le_of_lt hu2))
  have f1 : ρ / (1 - θ₁) * (θ₁ - x) =
      ρ * (θ₁ - x) * (1 - θ₂) * ((1 - θ₁)⁻¹ * (1 - θ₂)⁻¹) := by
    have : ρ * (θ₁ - x) * (1 - θ₂) * ((1 - θ₁)⁻¹ * (1 - θ₂)⁻¹) =
        ρ * (θ₁ - x) * (1 - θ₁)⁻¹ * ((1 - θ₂) * (1 - θ₂)⁻¹) := by grind
    rw [this, e2]
    grind
  have f2 : ρ / (1 - θ₂) * (θ₂ - x) =
      ρ * (θ₂ - x) * (1 - θ₁) * ((1 - θ₁)⁻¹ * (1 - θ₂)⁻¹) := by
    have : ρ * (θ₂ - x) * (1 - θ₁) * ((1 - θ₁)⁻¹ * (1 - θ₂)⁻¹) =
        ρ * (θ₂ - x) * (1 - θ₂)⁻¹ * ((1 - θ₁) * (1 - θ₁)⁻¹) := by grind
    rw [this, e1]
    grind
  rw [f1, f2]
  grind

set_option linter.unusedSectionVars false in
/-- A sum of zeros is zero. -/
theorem lsum_zero {γ : Type} (I : List γ) : lsum (fun _ : γ => (0 : α)) I = 0 := by
  induction I with
  | nil => rfl
  | cons i is ih =>
    simp only [lsum]
    rw [ih]
    grind

set_option linter.unusedSectionVars false in
/-- Finite sums commute: `Σ_x Σ_i g i x = Σ_i Σ_x g i x`. -/
theorem lsum_comm {β γ : Type} (g : γ → β → α) (I : List γ) (X : List β) :
    lsum (fun x => lsum (fun i => g i x) I) X = lsum (fun i => lsum (fun x => g i x) X) I := by
  induction X with
  | nil =>
    simp only [lsum]
    exact (lsum_zero I).symm
  | cons x xs ih =>
    simp only [lsum]
    rw [ih, lsum_add]

/-- A mixture of betting factors: if each factor `F i` has mean at most one under the outcome
weights `p` (`Σ_x p_x F_i(x) ≤ 1`), then so does their average with weights `w_i ≥ 0` summing
to one: `Σ_x p_x Σ_i w_i F_i(x) ≤ 1`. -/
theorem mixture_mean_le_one {β γ : Type} (p : β → α) (X : List β) (w : γ → α) (I : List γ)
    (F : γ → β → α) (hw : ∀ i ∈ I, 0 ≤ w i) (hw1 : lsum w I = 1)
    (hF : ∀ i ∈ I, lsum (fun x => p x * F i x) X ≤ 1) :
    lsum (fun x => p x * lsum (fun i => w i * F i x) I) X ≤ 1 := by
  have e1 : lsum (fun x => p x * lsum (fun i => w i * F i x) I) X =
      lsum (fun x => lsum (fun i => w i * (p x * F i x)) I) X := by
    apply lsum_congr
    intro x _
    rw [← lsum_mul_left]
    exact lsum_congr (fun i _ => by grind)
  have e2 : lsum (fun i => lsum (fun x => w i * (p x * F i x)) X) I =
      lsum (fun i => w i * lsum (fun x => p x * F i x) X) I :=
    lsum_congr (fun i _ => lsum_mul_left (w i) (fun x => p x * F i x) X)
  have h : lsum (fun i => w i * lsum (fun x => p x * F i x) X) I ≤ lsum (fun i => w i * 1) I :=
    lsum_le (fun i hi => Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (hF i hi) (hw i hi))
  have e3 : lsum (fun i => w i * 1) I = lsum w I := lsum_congr (fun i _ => by grind)
  rw [e1, lsum_comm (fun i x => w i * (p x * F i x)) I X, e2]
  grind

end WitCert.Audit

end
