/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Analytic

/-!
# The sharp softmax-to-TV bridge `tanh (osc/4)`

If every logit shift `Δ_t = z'_t − z_t` lies in `[m, M]`, then
`TV(softmax z, softmax z') ≤ tanh ((M − m)/4)`, with `tanh y = (exp (2y) − 1)/(exp (2y) + 1)`.

## Main definitions

* `WitCert.Analytic.tanhE`: `tanh y = (exp (2y) − 1)/(exp (2y) + 1)` from the exponential.
* `WitCert.Analytic.sharpOscArg`, `WitCert.Analytic.sharpLinfArg`, `WitCert.Analytic.eformArg`,
  `WitCert.Analytic.eformBridgeCore`, `WitCert.Analytic.affineSlopeArg`,
  `WitCert.Analytic.eformCore`, `WitCert.Analytic.twoSidedCore`: the transfer coefficients and
  algebraic cores of the softmax-to-TV statements, as definitions that the generated checks
  (`WitCert.GeneratedChecks`) evaluate against Python's values. Each is tied to its statement
  by an `example` below it, proved from the theorem itself by unfolding.

## Main statements

* `WitCert.Analytic.chord_abs_le`: one token, the chord bound of the convex `|x − Z|` on `[1, u]`.
* `WitCert.Analytic.tv_le_tanh_of_ratio`: the algebraic core: if `k a_t ≤ b_t ≤ k s² a_t`
  (`a, b > 0`, `k > 0`, `s ≥ 1`) then `TV(a/Σa, b/Σb) ≤ (s − 1)/(s + 1)`. Holds in every ordered
  field.
* `WitCert.Analytic.softmax_tv_tanh_sound`: the softmax form, `TV ≤ tanh (osc/4)`.

## Proof

Write `x_t = b_t/(k a_t) ∈ [1, u]` with `u = s²`, `p = a/Σa` and `Z = Σ_t p_t x_t ∈ [1, u]`, so
that `b_t/Σb = p_t x_t / Z` and `2 TV = Σ_t p_t |x_t − Z| / Z`. Since `|x − Z|` is convex in `x`,
it lies below its chord on `[1, u]`:
`(u − 1) |x − Z| ≤ (u − x)(Z − 1) + (x − 1)(u − Z)`, and summing with the weights `p_t`
(`Σ p = 1`, `Σ p x = Z`) gives `(u − 1) Σ_t p_t |x_t − Z| ≤ 2 (u − Z)(Z − 1)`. Finally
`(u − Z)(Z − 1) ≤ (s − 1)² Z` because the difference is `(Z − s)² ≥ 0`, so for `s > 1`,
`2 TV ≤ 2 (s − 1)²/(s² − 1) = 2 (s − 1)/(s + 1)`; for `s = 1` every `x_t = 1` and `TV = 0`.
The proof below works with the cleared forms (multiplied by `k² a_t Σa`), so it divides by
nothing but `Σa`, `Σb` and `s − 1`.

## Implementation notes

The exponential enters only through `ExpLaws` (see `WitCert.Analytic`); ℝ with `Real.exp`
satisfies those laws, and no model exists over `Rat`.
-/

public section

namespace WitCert.Analytic

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- `tanh y = (exp (2y) − 1)/(exp (2y) + 1)`, from the exponential of `E`. -/
@[expose] def tanhE (E : ExpLaws α) (y : α) : α := (E.exp (2 * y) - 1) / (E.exp (2 * y) + 1)

/-- `|x| ≥ 0`. -/
theorem absA_nonneg (x : α) : 0 ≤ absA x := by
  unfold absA; split <;> grind

omit [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α] in
/-- `|x| = x` for `x ≥ 0`. -/
theorem absA_of_nonneg {x : α} (h : 0 ≤ x) : absA x = x := by
  unfold absA; split <;> grind

/-- `|x| = -x` for `x ≤ 0`. -/
theorem absA_of_nonpos {x : α} (h : x ≤ 0) : absA x = -x := by
  unfold absA; split <;> grind

/-- `|x c| = |x| c` for `c ≥ 0`. -/
theorem absA_mul_of_nonneg {x c : α} (hc : 0 ≤ c) : absA (x * c) = absA x * c := by
  rcases Std.le_total (a := (0 : α)) (b := x) with h | h
  · have h1 := Lean.Grind.OrderedRing.mul_nonneg h hc
    rw [absA_of_nonneg h, absA_of_nonneg h1]
  · have h1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right h hc
    have h2 : x * c ≤ 0 := by grind
    rw [absA_of_nonpos h, absA_of_nonpos h2]
    grind

/-- One token, the chord bound in cleared form. With `x = b/(k a)` and `Z = B/(k A)`, it reads
`(u − 1) |x − Z| ≤ (u − x)(Z − 1) + (x − 1)(u − Z)`, multiplied by `k² a A`. -/
theorem chord_abs_le {a b A B k u : α} (hlo : k * a ≤ b) (hhi : b ≤ u * k * a)
    (hLo : k * A ≤ B) (hHi : B ≤ u * k * A) :
    (u - 1) * k * absA (a * B - b * A) ≤
      (u * k * a - b) * (B - k * A) + (b - k * a) * (u * k * A - B) := by
  have h1 := Lean.Grind.OrderedRing.mul_nonneg (show 0 ≤ u * k * a - b by grind)
    (show 0 ≤ B - k * A by grind)
  have h2 := Lean.Grind.OrderedRing.mul_nonneg (show 0 ≤ b - k * a by grind)
    (show 0 ≤ u * k * A - B by grind)
  unfold absA
  split <;> grind

/-- One token, the crude bound `|a B − b A| ≤ (u − 1) k A a` (used when `u = 1`). -/
theorem crude_abs_le {a b A B k u : α} (ha : 0 ≤ a) (hA : 0 ≤ A) (hlo : k * a ≤ b)
    (hhi : b ≤ u * k * a) (hLo : k * A ≤ B) (hHi : B ≤ u * k * A) :
    absA (a * B - b * A) ≤ (u - 1) * k * A * a := by
  have h1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hHi ha
  have h2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hLo ha
  have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right hhi hA
  have h4 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right hlo hA
  apply absA_le <;> grind

/-- The sharp bound in algebraic form: let `a_t, b_t > 0` be two weight vectors over the tokens
of a nonempty list with `k a_t ≤ b_t ≤ k s² a_t` for some `k > 0` and `s ≥ 1`. Then
`TV(a/Σa, b/Σb) ≤ (s − 1)/(s + 1)`. Holds in every ordered field. -/
theorem tv_le_tanh_of_ratio {β : Type} (a b : β → α) (L : List β) (hL : L ≠ [])
    (ha : ∀ t ∈ L, 0 < a t) {k s : α} (hk : 0 < k) (hs : 1 ≤ s)
    (hlo : ∀ t ∈ L, k * a t ≤ b t) (hhi : ∀ t ∈ L, b t ≤ s * s * k * a t) :
    tv (fun t => a t / lsum a L) (fun t => b t / lsum b L) L ≤ (s - 1) / (s + 1) := by
  have hb : ∀ t ∈ L, 0 < b t := fun t ht => by
    have := Lean.Grind.OrderedRing.mul_pos hk (ha t ht)
    have := hlo t ht
    grind
  have hA : 0 < lsum a L := lsum_pos hL ha
  have hB : 0 < lsum b L := lsum_pos hL hb
  -- k Σa ≤ Σb ≤ u k Σa
  have hLo : k * lsum a L ≤ lsum b L := by
    rw [← lsum_mul_left]; exact lsum_le hlo
  have hHi : lsum b L ≤ s * s * k * lsum a L := by
    rw [← lsum_mul_left]; exact lsum_le hhi
  -- the sum S = Σ_t |a_t Σb − b_t Σa|
  have hS0 : 0 ≤ lsum (fun t => absA (a t * lsum b L - b t * lsum a L)) L :=
    lsum_nonneg (fun t _ => absA_nonneg _)
  -- TV = ½ S / (Σa Σb)
  have htv : tv (fun t => a t / lsum a L) (fun t => b t / lsum b L) L =
      (1 / 2) * (lsum (fun t => absA (a t * lsum b L - b t * lsum a L)) L /
        (lsum a L * lsum b L)) := by
    unfold tv
    rw [← lsum_div]
    congr 1
    apply lsum_congr
    intro t _
    show absA (a t / lsum a L - b t / lsum b L) =
      absA (a t * lsum b L - b t * lsum a L) / (lsum a L * lsum b L)
    have hP : 0 < (lsum a L * lsum b L)⁻¹ :=
      inv_pos_of_pos (Lean.Grind.OrderedRing.mul_pos hA hB)
    have e : a t / lsum a L - b t / lsum b L =
        (a t * lsum b L - b t * lsum a L) * (lsum a L * lsum b L)⁻¹ := by grind
    rw [e, absA_mul_of_nonneg (Std.le_of_lt hP)]
    grind
  rw [htv]
  have hP : 0 < lsum a L * lsum b L := Lean.Grind.OrderedRing.mul_pos hA hB
  have hs1 : 0 < s + 1 := by grind
  -- (s + 1) S ≤ 2 (s − 1) Σa Σb
  have key : (s + 1) * lsum (fun t => absA (a t * lsum b L - b t * lsum a L)) L ≤
      2 * (s - 1) * (lsum a L * lsum b L) := by
    rcases Classical.em (s = 1) with h1 | h1
    · -- u = 1: every term vanishes
      have hc : lsum (fun t => absA (a t * lsum b L - b t * lsum a L)) L ≤
          lsum (fun t => ((s * s - 1) * k * lsum a L) * a t) L :=
        lsum_le (fun t ht => crude_abs_le (u := s * s) (Std.le_of_lt (ha t ht)) (Std.le_of_lt hA)
          (hlo t ht) (by have := hhi t ht; grind) hLo (by grind))
      rw [lsum_mul_left] at hc
      subst h1
      grind
    · have hgt : 0 < s - 1 := by grind
      -- the chord bounds, summed
      have hc : lsum (fun t => ((s * s - 1) * k) *
            absA (a t * lsum b L - b t * lsum a L)) L ≤
          lsum (fun t => (s * s * k * (lsum b L - k * lsum a L) -
              k * (s * s * k * lsum a L - lsum b L)) * a t +
            ((s * s * k * lsum a L - lsum b L) - (lsum b L - k * lsum a L)) * b t) L := by
        apply lsum_le
        intro t ht
        have := chord_abs_le (u := s * s) (hlo t ht) (by have := hhi t ht; grind) hLo
          (by grind)
        grind
      have hsum : lsum (fun t => (s * s * k * (lsum b L - k * lsum a L) -
              k * (s * s * k * lsum a L - lsum b L)) * a t +
            ((s * s * k * lsum a L - lsum b L) - (lsum b L - k * lsum a L)) * b t) L =
          (s * s * k * (lsum b L - k * lsum a L) -
              k * (s * s * k * lsum a L - lsum b L)) * lsum a L +
            ((s * s * k * lsum a L - lsum b L) - (lsum b L - k * lsum a L)) * lsum b L := by
        rw [lsum_add, lsum_mul_left, lsum_mul_left]
      rw [hsum, lsum_mul_left] at hc
      -- (u Σa k − Σb)(Σb − k Σa) ≤ (s − 1)² k Σa Σb, the difference being (Σb − s k Σa)²
      have hsq := Lean.Grind.OrderedRing.sq_nonneg (a := lsum b L - s * k * lsum a L)
      have hpos : 0 < (s - 1) * k := Lean.Grind.OrderedRing.mul_pos hgt hk
      apply le_of_mul_le_mul_left_pos hpos
      grind
  -- divide out
  apply le_of_mul_le_mul_left_pos (Lean.Grind.OrderedRing.mul_pos hs1 hP)
  have e1 : (s + 1) * (lsum a L * lsum b L) *
      ((1 / 2) * (lsum (fun t => absA (a t * lsum b L - b t * lsum a L)) L /
        (lsum a L * lsum b L))) =
      (1 / 2) * ((s + 1) * lsum (fun t => absA (a t * lsum b L - b t * lsum a L)) L) := by
    grind
  have e2 : (s + 1) * (lsum a L * lsum b L) * ((s - 1) / (s + 1)) =
      (1 / 2) * (2 * (s - 1) * (lsum a L * lsum b L)) := by
    grind
  rw [e1, e2]
  grind

/-- The sharp softmax-to-TV bridge: if every logit shift `Δ_t = z'_t − z_t` lies in `[m, M]`,
then `TV(softmax z, softmax z') ≤ tanh ((M − m)/4)`, with `tanh y = (exp (2y) − 1)/(exp (2y) + 1)`
(`tanhE`). Python: `bridges.softmax_tv_tanh` (the oscillation bridge). -/
theorem softmax_tv_tanh_sound {β : Type} (E : ExpLaws α) (z z' : β → α) (L : List β)
    (hL : L ≠ []) {m M : α} (hm : ∀ t ∈ L, m ≤ z' t - z t) (hM : ∀ t ∈ L, z' t - z t ≤ M) :
    tv (softmax E z L) (softmax E z' L) L ≤ tanhE E ((M - m) / 4) := by
  have hmM : m ≤ M := by
    cases L with
    | nil => exact absurd rfl hL
    | cons t _ =>
      have := hm t (by simp)
      have := hM t (by simp)
      grind
  have hy : 0 ≤ 2 * ((M - m) / 4) := by grind
  have hs : 1 ≤ E.exp (2 * ((M - m) / 4)) := by
    have := E.exp_le_exp hy
    rw [E.exp_zero] at this
    exact this
  have hss : E.exp (2 * ((M - m) / 4)) * E.exp (2 * ((M - m) / 4)) = E.exp (M - m) := by
    rw [← E.exp_add]
    congr 1
    grind
  have hlo : ∀ t ∈ L, E.exp m * E.exp (z t) ≤ E.exp (z' t) := by
    intro t ht
    have := hm t ht
    rw [← E.exp_add]
    exact E.exp_le_exp (by grind)
  have hhi : ∀ t ∈ L, E.exp (z' t) ≤ E.exp (2 * ((M - m) / 4)) * E.exp (2 * ((M - m) / 4)) *
      E.exp m * E.exp (z t) := by
    intro t ht
    have := hM t ht
    rw [hss, ← E.exp_add, ← E.exp_add]
    exact E.exp_le_exp (by grind)
  exact tv_le_tanh_of_ratio (fun t => E.exp (z t)) (fun t => E.exp (z' t)) L hL
    (fun t _ => E.exp_pos _) (E.exp_pos m) hs hlo hhi

end WitCert.Analytic

/-! ### The coefficients of the statements, as definitions

Each definition below is the piece of a softmax-to-TV statement that Python evaluates with its
own constants. The `example` after it re-derives the statement's bound in terms of the
definition from the theorem itself (`exact`, by unfolding), so a definition that drifted from
its statement fails here, and `WitCert.GeneratedChecks` compares each definition, evaluated
over `Rat`, with the value Python's code computes. -/

namespace WitCert.Analytic

section Coefficients

variable {α : Type} [Lean.Grind.Field α]

/-- The argument of `tanh` in `softmax_tv_tanh_sound` for a logit oscillation `osc = M − m`:
`osc / 4`. Python: the `k = 1/4` of `bridges.softmax_tv_tanh_osc`. -/
@[expose] def sharpOscArg (osc : α) : α := osc / 4

/-- The argument of `tanh` for a sup-norm logit error `ε`: every shift lies in `[−ε, ε]`, an
oscillation of `ε − (−ε)`, so `sharpOscArg (ε − (−ε)) = ε / 2`. Python: the `k = 1/2` of
`bridges.softmax_tv_tanh`. -/
@[expose] def sharpLinfArg (ε : α) : α := sharpOscArg (ε - -ε)

/-- The argument of `exp` in `softmax_tv_eform_sound`: `2 ε`. -/
@[expose] def eformArg (ε : α) : α := 2 * ε

/-- The bound of `softmax_tv_eform_sound` as a function of `x = exp (2ε)`: `½ (x − 1)`. Python:
`TransferKind.EXP_TV`, `(exp(2x) − 1) / 2`. -/
@[expose] def eformBridgeCore (x : α) : α := (1 / 2) * (x - 1)

/-- The argument of `exp` in the slope of `softmax_tv_affine_sound`: `2 ε₀`. Python: the slope
`exp(2 eps0)` of `bridges.softmax_tv_affine`. -/
@[expose] def affineSlopeArg (ε₀ : α) : α := 2 * ε₀

/-- The e-form meter's algebraic core `½ (A² − 1)` (`tv_le_eform_of_ratio`,
`Meters.tv_eform_sound`). Python: `tv_forms._eform_raw`. -/
@[expose] def eformCore (A : α) : α := (1 / 2) * (A * A - 1)

/-- The two-sided meter's algebraic core `½ (A/A⁻ − A⁻/A)` (`tv_le_two_sided_of_ratio`,
`Meters.tv_two_sided_sound`). Python: `tv_forms._two_sided_raw`. -/
@[expose] def twoSidedCore (A Am : α) : α := (1 / 2) * (A / Am - Am / A)

end Coefficients

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- `softmax_tv_tanh_sound` with its argument as `sharpOscArg`. -/
example {β : Type} (E : ExpLaws α) (z z' : β → α) (L : List β) (hL : L ≠ []) {m M : α}
    (hm : ∀ t ∈ L, m ≤ z' t - z t) (hM : ∀ t ∈ L, z' t - z t ≤ M) :
    tv (softmax E z L) (softmax E z' L) L ≤ tanhE E (sharpOscArg (M - m)) :=
  softmax_tv_tanh_sound E z z' L hL hm hM

/-- The sup-norm form: `|z_t − z'_t| ≤ ε` gives `TV ≤ tanh (sharpLinfArg ε)`, from
`softmax_tv_tanh_sound` with `m = −ε`, `M = ε`. -/
example {β : Type} (E : ExpLaws α) (z z' : β → α) (L : List β) (hL : L ≠ []) (ε : α)
    (hε : ∀ t ∈ L, absA (z t - z' t) ≤ ε) :
    tv (softmax E z L) (softmax E z' L) L ≤ tanhE E (sharpLinfArg ε) :=
  softmax_tv_tanh_sound E z z' L hL (m := -ε) (M := ε)
    (fun t ht => by have := le_of_absA_le (hε t ht); grind)
    (fun t ht => by have := le_of_absA_le (hε t ht); grind)

/-- `softmax_tv_eform_sound` as `eformBridgeCore (exp (eformArg ε))`. -/
example {β : Type} (E : ExpLaws α) (z z' : β → α) (L : List β) (hL : L ≠ []) (ε : α)
    (hε : ∀ t ∈ L, absA (z t - z' t) ≤ ε) :
    tv (softmax E z L) (softmax E z' L) L ≤ eformBridgeCore (E.exp (eformArg ε)) :=
  softmax_tv_eform_sound E z z' L hL ε hε

/-- `softmax_tv_affine_sound` with its slope as `exp (affineSlopeArg ε₀)`. -/
example {β : Type} (E : ExpLaws α) (z z' : β → α) (L : List β) (hL : L ≠ []) {ε ε₀ : α}
    (h0 : 0 ≤ ε) (hε₀ : ε ≤ ε₀) (hε : ∀ t ∈ L, absA (z t - z' t) ≤ ε) :
    tv (softmax E z L) (softmax E z' L) L ≤ E.exp (affineSlopeArg ε₀) * ε :=
  softmax_tv_affine_sound E z z' L hL h0 hε₀ hε

/-- `tv_le_eform_of_ratio` as `eformCore A`. -/
example {β : Type} (u v k : β → α) (L : List β) (hL : L ≠ [])
    (hu : ∀ t ∈ L, 0 < u t) (hv : ∀ t ∈ L, 0 < v t) (hk : ∀ t ∈ L, 0 < k t)
    (huv : ∀ t ∈ L, u t ≤ k t * v t) (hvu : ∀ t ∈ L, v t ≤ k t * u t) :
    tv (fun t => u t / lsum u L) (fun t => v t / lsum v L) L ≤ eformCore (meterA v k L) :=
  tv_le_eform_of_ratio u v k L hL hu hv hk huv hvu

/-- `tv_le_two_sided_of_ratio` as `twoSidedCore A A⁻`. -/
example {β : Type} (u v k : β → α) (L : List β) (hL : L ≠ [])
    (hu : ∀ t ∈ L, 0 < u t) (hv : ∀ t ∈ L, 0 < v t) (hk : ∀ t ∈ L, 1 ≤ k t)
    (huv : ∀ t ∈ L, u t ≤ k t * v t) (hvu : ∀ t ∈ L, v t ≤ k t * u t) :
    tv (fun t => u t / lsum u L) (fun t => v t / lsum v L) L ≤
      twoSidedCore (meterA v k L) (meterAm v k L) :=
  tv_le_two_sided_of_ratio u v k L hL hu hv hk huv hvu

end WitCert.Analytic

end
