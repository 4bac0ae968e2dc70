/-
Formal companion of the analytic facts behind `witcert_calculus.bridges` (softmax-to-TV bridges)
and `witcert_calculus.meters`.
-/
module

public section

/-!
# Analytic facts over an abstract ordered field with an exponential

## Main definitions

* `WitCert.Analytic.ExpLaws`: an explicit structure of laws for a function `exp : α → α`.
* `WitCert.Analytic.ExpLogLaws`: the same, together with a logarithm inverse to `exp` on `(0, ∞)`.
* `WitCert.Analytic.lsum`: the sum of `f t` over a list of tokens.
* `WitCert.Analytic.absA`: absolute value in the carrier.
* `WitCert.Analytic.tv`: total variation distance `½ Σ_t |p_t − q_t|` of two weight vectors.
* `WitCert.Analytic.softmax`: `softmax z t = exp (z t) / Σ_s exp (z s)`.

## Main statements

* `WitCert.Analytic.tv_le_eform_of_ratio`: the e-form bound, purely algebraic: if the exact and
  the compressed token weights are within a factor `k_t` of each other, then
  `TV ≤ ½ (A² − 1)` with `A = Σ_t p̃_t k_t`.
* `WitCert.Analytic.softmax_tv_eform_general`: the same for softmax with `|z_t − z̃_t| ≤ c_t`
  and `k_t = exp c_t`.
* `WitCert.Analytic.softmax_tv_eform_sound`: `|Δ_t| ≤ ε` for all `t` gives
  `TV ≤ ½ (exp (2ε) − 1)`.
* `WitCert.Analytic.softmax_tv_affine_sound`: for `0 ≤ ε ≤ ε₀`, `TV ≤ exp (2ε₀) · ε`.
* `WitCert.Analytic.one_sub_pow_le_exp`: `(1 − p)^n ≤ exp (−n p)` for `0 ≤ p ≤ 1`.

## Implementation notes

The carrier `α` is abstract: any type with core's ordered-field classes (`Lean.Grind.Field`,
`Lean.Grind.OrderedRing`, `Std.IsLinearOrder`, `Std.LawfulOrderLT`). The exponential is not
defined here but passed as a value `E : ExpLaws α` whose fields are the laws used:
`exp (x + y) = exp x * exp y`, `exp 0 = 1`, `0 < exp x`, `1 + x ≤ exp x` (monotonicity is
derived from these). The logarithm of `ExpLogLaws` only adds `exp (log x) = x` for `0 < x`.
No `axiom` is declared: every theorem takes the laws as a hypothesis.

The real numbers with `Real.exp` and `Real.log` satisfy each law (standard facts:
`Real.exp_add`, `Real.exp_zero`, `Real.exp_pos`, `Real.add_one_le_exp`, `Real.exp_log`), so
every theorem here holds for ℝ. Beware vacuity: these laws have no model over `Rat` (together
they force `exp 1 = e`, which is irrational), so nothing is stated for `Rat` with these laws; the
purely algebraic statements (`tv_le_eform_of_ratio`) need no exponential and hold in every
ordered field, `Rat` included.

The sharp `tanh (osc/4)` softmax bound is proved from these laws in `WitCert/Sharp.lean`; the
sub-Gaussian proxy `s²/12` of the dither grid is proved in `WitCert/Dither.lean` from these laws
and `cosh y ≤ exp (y²/2)`.

Each theorem keeps the section's whole carrier context, classes its proof does not use
included: they are part of its statement as exported and locked (`formal/statements.lock.json`).
Where one goes unused, the `unusedSectionVars` linter is switched off for that theorem alone
(`set_option ... in`) instead of omitting the class, which would change the statement.
-/

namespace WitCert.Analytic

/-- Laws of an exponential function on an ordered field `α`. The real exponential satisfies
each field (`Real.exp_add`, `Real.exp_zero`, `Real.exp_pos`, `Real.add_one_le_exp`); over `Rat`
there is no such function. -/
structure ExpLaws (α : Type) [Lean.Grind.Field α] [LE α] [LT α] where
  /-- The exponential. -/
  exp : α → α
  /-- `exp (x + y) = exp x * exp y`. -/
  exp_add : ∀ x y, exp (x + y) = exp x * exp y
  /-- `exp 0 = 1`. -/
  exp_zero : exp 0 = 1
  /-- `exp` is positive. -/
  exp_pos : ∀ x, 0 < exp x
  /-- The tangent line at `0` lies below `exp`: `1 + x ≤ exp x`. -/
  one_add_le_exp : ∀ x, 1 + x ≤ exp x

/-- Laws of an exponential with a logarithm inverse to it on `(0, ∞)`. The real `Real.log`
satisfies `Real.exp_log`. -/
structure ExpLogLaws (α : Type) [Lean.Grind.Field α] [LE α] [LT α] extends ExpLaws α where
  /-- The logarithm. -/
  log : α → α
  /-- `exp (log x) = x` for `0 < x`. -/
  exp_log : ∀ x, 0 < x → exp (log x) = x

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

attribute [local instance] Lean.Grind.Semiring.natCast

/-! ### Order and field helpers -/

/-- Cancel a positive factor on the left of an inequality. -/
theorem le_of_mul_le_mul_left_pos {a b c : α} (hc : 0 < c) (h : c * a ≤ c * b) : a ≤ b :=
  Classical.byContradiction fun hn => by
    have h1 : b < a := by grind
    have h2 := Lean.Grind.OrderedRing.mul_lt_mul_of_pos_left h1 hc
    grind

/-- The inverse of a positive element is positive. -/
theorem inv_pos_of_pos {x : α} (h : 0 < x) : 0 < x⁻¹ := by
  have h1 : x * x⁻¹ = 1 := by grind
  rcases Std.le_total (a := x⁻¹) (b := 0) with h2 | h2
  · have := Lean.Grind.OrderedRing.mul_nonpos_of_nonneg_of_nonpos (Std.le_of_lt h) h2
    grind
  · grind

/-- A quotient of positive elements is positive. -/
theorem div_pos_of_pos {a b : α} (ha : 0 < a) (hb : 0 < b) : 0 < a / b := by
  have := Lean.Grind.OrderedRing.mul_pos ha (inv_pos_of_pos hb)
  grind

/-- Dividing by a positive element is monotone. -/
theorem div_le_div_of_le {a b c : α} (hc : 0 < c) (h : a ≤ b) : a / c ≤ b / c := by
  have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right h (Std.le_of_lt (inv_pos_of_pos hc))
  grind

/-- Powers of a nonnegative element are nonnegative. -/
theorem pow_nonneg_of_nonneg {x : α} (h : 0 ≤ x) (n : Nat) : 0 ≤ x ^ n := by
  induction n with
  | zero => grind
  | succ n ih => have := Lean.Grind.OrderedRing.mul_nonneg ih h; grind

/-- AM–GM for a positive element and its inverse: `2 ≤ a + 1/a`, as `2 ≤ k/A + A/k`. -/
theorem two_le_div_add_div {k A : α} (hk : 0 < k) (hA : 0 < A) : 2 ≤ k / A + A / k := by
  have ha : 0 < k / A := div_pos_of_pos hk hA
  have hab : k / A * (A / k) = 1 := by grind
  have hsq := Lean.Grind.OrderedRing.sq_nonneg (a := k / A - 1)
  apply le_of_mul_le_mul_left_pos ha
  grind

/-! ### Absolute value -/

/-- Absolute value. -/
@[expose] noncomputable def absA (x : α) : α :=
  @ite α (0 ≤ x) (Classical.propDecidable _) x (-x)

set_option linter.unusedSectionVars false in
/-- `|x| ≤ y` from `x ≤ y` and `-x ≤ y`. -/
theorem absA_le {x y : α} (h1 : x ≤ y) (h2 : -x ≤ y) : absA x ≤ y := by
  unfold absA; split <;> grind

/-- `|x| ≤ y` gives `x ≤ y` and `-x ≤ y`. -/
theorem le_of_absA_le {x y : α} (h : absA x ≤ y) : x ≤ y ∧ -x ≤ y := by
  unfold absA at h; split at h <;> grind

/-! ### Sums over lists of tokens -/

/-- The sum of `f t` over the tokens `t` of the list `L`. -/
@[expose] def lsum {β : Type} (f : β → α) : List β → α
  | [] => 0
  | x :: xs => f x + lsum f xs

set_option linter.unusedSectionVars false in
theorem lsum_add {β : Type} (f g : β → α) (L : List β) :
    lsum (fun t => f t + g t) L = lsum f L + lsum g L := by
  induction L with
  | nil => simp only [lsum]; grind
  | cons x xs ih => simp only [lsum, ih]; grind

set_option linter.unusedSectionVars false in
theorem lsum_mul_left {β : Type} (c : α) (f : β → α) (L : List β) :
    lsum (fun t => c * f t) L = c * lsum f L := by
  induction L with
  | nil => simp only [lsum]; grind
  | cons x xs ih => simp only [lsum, ih]; grind

set_option linter.unusedSectionVars false in
theorem lsum_div {β : Type} (f : β → α) (c : α) (L : List β) :
    lsum (fun t => f t / c) L = lsum f L / c := by
  induction L with
  | nil => simp only [lsum]; grind
  | cons x xs ih => simp only [lsum, ih]; grind

set_option linter.unusedSectionVars false in
theorem lsum_congr {β : Type} {f g : β → α} {L : List β} (h : ∀ t ∈ L, f t = g t) :
    lsum f L = lsum g L := by
  induction L with
  | nil => rfl
  | cons x xs ih =>
    simp only [lsum]
    rw [h x (by simp), ih (fun t ht => h t (by simp [ht]))]

theorem lsum_le {β : Type} {f g : β → α} {L : List β} (h : ∀ t ∈ L, f t ≤ g t) :
    lsum f L ≤ lsum g L := by
  induction L with
  | nil => simp only [lsum]; grind
  | cons x xs ih =>
    simp only [lsum]
    have h1 := h x (by simp)
    have h2 := ih (fun t ht => h t (by simp [ht]))
    grind

theorem lsum_nonneg {β : Type} {f : β → α} {L : List β} (h : ∀ t ∈ L, 0 ≤ f t) :
    0 ≤ lsum f L := by
  induction L with
  | nil => simp only [lsum]; grind
  | cons x xs ih =>
    simp only [lsum]
    have h1 := h x (by simp)
    have h2 := ih (fun t ht => h t (by simp [ht]))
    grind

theorem lsum_pos {β : Type} {f : β → α} {L : List β} (hL : L ≠ []) (h : ∀ t ∈ L, 0 < f t) :
    0 < lsum f L := by
  cases L with
  | nil => exact absurd rfl hL
  | cons x xs =>
    simp only [lsum]
    have h1 := h x (by simp)
    have h2 := lsum_nonneg (f := f) (L := xs) (fun t ht => Std.le_of_lt (h t (by simp [ht])))
    grind

/-! ### Distributions, total variation, softmax -/

/-- Total variation distance `½ Σ_t |p_t − q_t|` over the tokens of `L`. -/
@[expose] noncomputable def tv {β : Type} (p q : β → α) (L : List β) : α :=
  (1 / 2) * lsum (fun t => absA (p t - q t)) L

/-- Softmax of the logits `z` over the tokens of `L`: `exp (z t) / Σ_s exp (z s)`. -/
@[expose] def softmax {β : Type} (E : ExpLaws α) (z : β → α) (L : List β) (t : β) : α :=
  E.exp (z t) / lsum (fun s => E.exp (z s)) L

/-! ### The e-form bound, algebraic core -/

/-- One token, upper side: from `x ρ ≤ k y`, `A⁻ ≤ ρ` and `A A⁻ ≥ 1`, `x ≤ y (A k)`. -/
theorem token_upper {x y k A Am ρ : α} (hx : 0 ≤ x) (hA : 0 ≤ A) (hAAm : 1 ≤ A * Am)
    (hρ : Am ≤ ρ) (h : x * ρ ≤ k * y) : x ≤ y * (A * k) := by
  have h1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hρ hx
  have h2 : x * Am ≤ k * y := by grind
  have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right h2 hA
  have h4 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hAAm hx
  grind

/-- One token, lower side: from `y ≤ k x ρ` and `ρ ≤ A`, `y − x ≤ y (A k − 1)`. -/
theorem token_lower {x y k A ρ : α} (hx : 0 ≤ x) (hy : 0 ≤ y) (hk : 0 < k) (hA : 0 < A)
    (hρ : ρ ≤ A) (h : y ≤ k * (x * ρ)) : y ≤ x + y * (A * k - 1) := by
  have h1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hρ
    (Lean.Grind.OrderedRing.mul_nonneg (Std.le_of_lt hk) hx)
  have hw : 0 < A * k := Lean.Grind.OrderedRing.mul_pos hA hk
  have h2 : y ≤ x * (A * k) := by grind
  have h3 := Lean.Grind.OrderedRing.mul_nonneg hy
    (Lean.Grind.OrderedRing.sq_nonneg (a := A * k - 1))
  apply le_of_mul_le_mul_left_pos hw
  grind

/-- One token: `|x − y| ≤ y (A k − 1)`. -/
theorem token_abs {x y k A Am ρ : α} (hx : 0 ≤ x) (hy : 0 ≤ y) (hk : 0 < k) (hA : 0 < A)
    (hAAm : 1 ≤ A * Am) (hρl : Am ≤ ρ) (hρu : ρ ≤ A) (h1 : x * ρ ≤ k * y)
    (h2 : y ≤ k * (x * ρ)) : absA (x - y) ≤ y * (A * k - 1) := by
  have u := token_upper hx (Std.le_of_lt hA) hAAm hρl h1
  have l := token_lower hx hy hk hA hρu h2
  apply absA_le <;> grind

/-- One token, upper side of the two-sided form: from `x ρ ≤ k y` and `A⁻ ≤ ρ`, `x ≤ y (k/A⁻)`. -/
theorem token_upper2 {x y k Am ρ : α} (hx : 0 ≤ x) (hAm : 0 < Am) (hρ : Am ≤ ρ)
    (h : x * ρ ≤ k * y) : x ≤ y * (k / Am) := by
  have h1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hρ hx
  apply le_of_mul_le_mul_left_pos hAm
  have e : Am * (y * (k / Am)) = k * y := by grind
  rw [e]
  grind

/-- One token, lower side of the two-sided form: from `y ≤ k x ρ` and `ρ ≤ A`,
`y (1/(k A)) ≤ x`. -/
theorem token_lower2 {x y k A ρ : α} (hx : 0 ≤ x) (hk : 0 < k) (hA : 0 < A) (hρ : ρ ≤ A)
    (h : y ≤ k * (x * ρ)) : y * (1 / (k * A)) ≤ x := by
  have h1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hρ
    (Lean.Grind.OrderedRing.mul_nonneg (Std.le_of_lt hk) hx)
  have hw : 0 < k * A := Lean.Grind.OrderedRing.mul_pos hk hA
  apply le_of_mul_le_mul_left_pos hw
  have e : k * A * (y * (1 / (k * A))) = y := by grind
  rw [e]
  grind

/-- The meter's `A = Σ_t p̃_t k_t` for compressed weights `v` (so `p̃ = v / Σv`). -/
@[expose] def meterA {β : Type} (v k : β → α) (L : List β) : α :=
  lsum (fun t => v t / lsum v L * k t) L

/-- The meter's `A⁻ = Σ_t p̃_t / k_t` for compressed weights `v`. -/
@[expose] def meterAm {β : Type} (v k : β → α) (L : List β) : α :=
  lsum (fun t => v t / lsum v L / k t) L

/-- The per-token retention form in algebraic form, the common root of the e-form and the
two-sided bounds. Let `u_t, v_t > 0` be the exact and the compressed weights of the tokens of a
nonempty list, within a factor `k_t > 0` of each other (`u_t ≤ k_t v_t`, `v_t ≤ k_t u_t`); let
`p = u / Σu`, `p̃ = v / Σv`, `A = Σ p̃ k`, `A⁻ = Σ p̃ / k`. For any per-token weights `b_t` with
`b_t ≥ min(A k_t − 1, max(k_t/A⁻ − 1, 1 − 1/(k_t A)))`, `TV(p, p̃) ≤ ½ Σ_t p̃_t b_t`.
Holds in every ordered field. -/
theorem tv_le_retention_of_ratio {β : Type} (u v k b : β → α) (L : List β) (hL : L ≠ [])
    (hu : ∀ t ∈ L, 0 < u t) (hv : ∀ t ∈ L, 0 < v t) (hk : ∀ t ∈ L, 0 < k t)
    (huv : ∀ t ∈ L, u t ≤ k t * v t) (hvu : ∀ t ∈ L, v t ≤ k t * u t)
    (hb : ∀ t ∈ L, meterA v k L * k t - 1 ≤ b t ∨
      (k t / meterAm v k L - 1 ≤ b t ∧ 1 - 1 / (k t * meterA v k L) ≤ b t)) :
    tv (fun t => u t / lsum u L) (fun t => v t / lsum v L) L ≤
      (1 / 2) * lsum (fun t => v t / lsum v L * b t) L := by
  unfold meterA meterAm at hb
  have hU : 0 < lsum u L := lsum_pos hL hu
  have hV : 0 < lsum v L := lsum_pos hL hv
  -- the compressed distribution sums to one
  have hq1 : lsum (fun t => v t / lsum v L) L = 1 := by rw [lsum_div]; grind
  -- A and A⁻
  have hA : 0 < lsum (fun t => v t / lsum v L * k t) L :=
    lsum_pos hL (fun t ht => Lean.Grind.OrderedRing.mul_pos (div_pos_of_pos (hv t ht) hV) (hk t ht))
  have hAm : 0 < lsum (fun t => v t / lsum v L / k t) L :=
    lsum_pos hL (fun t ht => div_pos_of_pos (div_pos_of_pos (hv t ht) hV) (hk t ht))
  -- Cauchy–Schwarz through AM–GM: A A⁻ ≥ 1
  have hAAm : 1 ≤ lsum (fun t => v t / lsum v L * k t) L *
      lsum (fun t => v t / lsum v L / k t) L := by
    have h1 : lsum (fun t => 2 * (v t / lsum v L)) L ≤
        lsum (fun t => v t / lsum v L * k t / lsum (fun t => v t / lsum v L * k t) L +
          lsum (fun t => v t / lsum v L * k t) L * (v t / lsum v L / k t)) L := by
      apply lsum_le
      intro t ht
      have hq : 0 < v t / lsum v L := div_pos_of_pos (hv t ht) hV
      have h2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (two_le_div_add_div (hk t ht) hA)
        (Std.le_of_lt hq)
      have hkt := hk t ht
      grind
    rw [lsum_add, lsum_div, lsum_mul_left, lsum_mul_left, hq1] at h1
    grind
  -- ρ = Σu / Σv lies in [A⁻, A]
  have hρu : lsum u L / lsum v L ≤ lsum (fun t => v t / lsum v L * k t) L := by
    have h1 : lsum u L ≤ lsum (fun t => k t * v t) L := lsum_le huv
    have h2 : lsum (fun t => v t / lsum v L * k t) L = lsum (fun t => k t * v t / lsum v L) L :=
      lsum_congr (fun t _ => by grind)
    rw [h2, lsum_div]
    exact div_le_div_of_le hV h1
  have hρl : lsum (fun t => v t / lsum v L / k t) L ≤ lsum u L / lsum v L := by
    have h1 : lsum (fun t => v t / k t) L ≤ lsum u L := by
      apply lsum_le
      intro t ht
      have hkt := hk t ht
      have h3 := div_le_div_of_le hkt (hvu t ht)
      have e : k t * u t / k t = u t := by grind
      rw [e] at h3
      exact h3
    have h2 : lsum (fun t => v t / lsum v L / k t) L = lsum (fun t => v t / k t / lsum v L) L :=
      lsum_congr (fun t _ => by grind)
    rw [h2, lsum_div]
    exact div_le_div_of_le hV h1
  -- the per-token bound, summed
  unfold tv
  show (1 / 2 : α) * lsum (fun t => absA (u t / lsum u L - v t / lsum v L)) L ≤ _
  have hsum : lsum (fun t => absA (u t / lsum u L - v t / lsum v L)) L ≤
      lsum (fun t => v t / lsum v L * b t) L := by
    apply lsum_le
    intro t ht
    have hut := hu t ht
    have hvt := hv t ht
    have hkt := hk t ht
    have e1 : u t / lsum u L * (lsum u L / lsum v L) = u t / lsum v L := by grind
    have e2 : k t * (v t / lsum v L) = k t * v t / lsum v L := by grind
    have e3 : k t * (u t / lsum u L * (lsum u L / lsum v L)) = k t * u t / lsum v L := by grind
    have d1 := div_le_div_of_le hV (huv t ht)
    have d2 := div_le_div_of_le hV (hvu t ht)
    have hx : 0 ≤ u t / lsum u L := Std.le_of_lt (div_pos_of_pos hut hU)
    have hy : 0 ≤ v t / lsum v L := Std.le_of_lt (div_pos_of_pos hvt hV)
    have g1 : u t / lsum u L * (lsum u L / lsum v L) ≤ k t * (v t / lsum v L) := by grind
    have g2 : v t / lsum v L ≤ k t * (u t / lsum u L * (lsum u L / lsum v L)) := by grind
    rcases hb t ht with hb1 | ⟨hb2, hb3⟩
    · have a1 := token_abs hx hy hkt hA hAAm hρl hρu g1 g2
      have a2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hb1 hy
      grind
    · have a1 := token_upper2 hx hAm hρl g1
      have a2 := token_lower2 hx hkt hA hρu g2
      have a3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hb2 hy
      have a4 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hb3 hy
      apply absA_le <;> grind
  grind

/-- The e-form bound in algebraic form: with the hypotheses of `tv_le_retention_of_ratio`,
`TV(p, p̃) ≤ ½ (A² − 1)` where `A = Σ_t p̃_t k_t`. Holds in every ordered field. -/
theorem tv_le_eform_of_ratio {β : Type} (u v k : β → α) (L : List β) (hL : L ≠ [])
    (hu : ∀ t ∈ L, 0 < u t) (hv : ∀ t ∈ L, 0 < v t) (hk : ∀ t ∈ L, 0 < k t)
    (huv : ∀ t ∈ L, u t ≤ k t * v t) (hvu : ∀ t ∈ L, v t ≤ k t * u t) :
    tv (fun t => u t / lsum u L) (fun t => v t / lsum v L) L ≤
      (1 / 2) * (meterA v k L * meterA v k L - 1) := by
  have h := tv_le_retention_of_ratio u v k (fun t => meterA v k L * k t - 1) L hL hu hv hk huv hvu
    (fun t _ => Or.inl (Std.le_refl _))
  have hV : 0 < lsum v L := lsum_pos hL hv
  have hq1 : lsum (fun t => v t / lsum v L) L = 1 := by rw [lsum_div]; grind
  have hval : lsum (fun t => v t / lsum v L * (meterA v k L * k t - 1)) L
      = lsum (fun t => meterA v k L * (v t / lsum v L * k t) + (-1) * (v t / lsum v L)) L :=
    lsum_congr (fun t _ => by grind)
  rw [hval, lsum_add, lsum_mul_left, lsum_mul_left, hq1] at h
  have hA : lsum (fun t => v t / lsum v L * k t) L = meterA v k L := rfl
  rw [hA] at h
  grind

/-- The two-sided bound in algebraic form: with the hypotheses of `tv_le_retention_of_ratio` and
`k_t ≥ 1`, `TV(p, p̃) ≤ ½ (A/A⁻ − A⁻/A)`. Holds in every ordered field. -/
theorem tv_le_two_sided_of_ratio {β : Type} (u v k : β → α) (L : List β) (hL : L ≠ [])
    (hu : ∀ t ∈ L, 0 < u t) (hv : ∀ t ∈ L, 0 < v t) (hk : ∀ t ∈ L, 1 ≤ k t)
    (huv : ∀ t ∈ L, u t ≤ k t * v t) (hvu : ∀ t ∈ L, v t ≤ k t * u t) :
    tv (fun t => u t / lsum u L) (fun t => v t / lsum v L) L ≤
      (1 / 2) * (meterA v k L / meterAm v k L - meterAm v k L / meterA v k L) := by
  have hk0 : ∀ t ∈ L, 0 < k t := fun t ht => by have := hk t ht; grind
  have hV : 0 < lsum v L := lsum_pos hL hv
  have hq1 : lsum (fun t => v t / lsum v L) L = 1 := by rw [lsum_div]; grind
  have hA : 0 < meterA v k L :=
    lsum_pos hL (fun t ht => Lean.Grind.OrderedRing.mul_pos (div_pos_of_pos (hv t ht) hV) (hk0 t ht))
  have hAm : 0 < meterAm v k L :=
    lsum_pos hL (fun t ht => div_pos_of_pos (div_pos_of_pos (hv t ht) hV) (hk0 t ht))
  -- A ≥ 1 and A⁻ ≤ 1
  have hA1 : 1 ≤ meterA v k L := by
    have h1 : lsum (fun t => v t / lsum v L) L ≤ meterA v k L := by
      apply lsum_le
      intro t ht
      have hq : 0 ≤ v t / lsum v L := Std.le_of_lt (div_pos_of_pos (hv t ht) hV)
      have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (hk t ht) hq
      grind
    grind
  have hAm1 : meterAm v k L ≤ 1 := by
    have h1 : meterAm v k L ≤ lsum (fun t => v t / lsum v L) L := by
      apply lsum_le
      intro t ht
      have hq : 0 ≤ v t / lsum v L := Std.le_of_lt (div_pos_of_pos (hv t ht) hV)
      have hkt := hk0 t ht
      have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (hk t ht) hq
      apply le_of_mul_le_mul_left_pos hkt
      have e : k t * (v t / lsum v L / k t) = v t / lsum v L := by grind
      rw [e]
      grind
    grind
  have h := tv_le_retention_of_ratio u v k
    (fun t => k t / meterAm v k L - 1 / (k t * meterA v k L)) L hL hu hv hk0 huv hvu
    (fun t ht => by
      try dsimp only
      have hkt := hk t ht
      have hkA : 1 ≤ k t * meterA v k L := by
        have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hA1 (Std.le_of_lt (hk0 t ht))
        grind
      have hkA0 : 0 < k t * meterA v k L := Lean.Grind.OrderedRing.mul_pos (hk0 t ht) hA
      have i1 : 1 / (k t * meterA v k L) ≤ 1 := by
        apply le_of_mul_le_mul_left_pos hkA0
        grind
      have i2 : 1 ≤ k t / meterAm v k L := by
        apply le_of_mul_le_mul_left_pos hAm
        have e : meterAm v k L * (k t / meterAm v k L) = k t := by grind
        rw [e]
        grind
      exact Or.inr ⟨by grind, by grind⟩)
  have hval : lsum (fun t => v t / lsum v L *
      (k t / meterAm v k L - 1 / (k t * meterA v k L))) L =
      lsum (fun t => v t / lsum v L * k t / meterAm v k L +
        (-1) * (v t / lsum v L / k t / meterA v k L)) L :=
    lsum_congr (fun t ht => by have := hk0 t ht; grind)
  rw [hval, lsum_add, lsum_div, lsum_mul_left, lsum_div] at h
  have e1 : lsum (fun t => v t / lsum v L * k t) L = meterA v k L := rfl
  have e2 : lsum (fun t => v t / lsum v L / k t) L = meterAm v k L := rfl
  rw [e1, e2] at h
  grind

/-! ### The exponential -/

section Exp

variable (E : ExpLaws α)

set_option linter.unusedSectionVars false in
theorem ExpLaws.exp_mul_exp_neg (x : α) : E.exp x * E.exp (-x) = 1 := by
  have h := E.exp_add x (-x)
  rw [show x + -x = 0 by grind, E.exp_zero] at h
  grind

theorem ExpLaws.exp_le_exp {x y : α} (h : x ≤ y) : E.exp x ≤ E.exp y := by
  have h1 := E.exp_add x (y - x)
  rw [show x + (y - x) = y by grind] at h1
  have h2 := E.one_add_le_exp (y - x)
  have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left
    (show (1 : α) ≤ E.exp (y - x) by grind) (Std.le_of_lt (E.exp_pos x))
  grind

theorem ExpLaws.exp_lt_exp {x y : α} (h : x < y) : E.exp x < E.exp y := by
  have h1 := E.exp_add x (y - x)
  rw [show x + (y - x) = y by grind] at h1
  have h2 := E.one_add_le_exp (y - x)
  have h3 := Lean.Grind.OrderedRing.mul_lt_mul_of_pos_left
    (show (1 : α) < E.exp (y - x) by grind) (E.exp_pos x)
  grind

set_option linter.unusedSectionVars false in
theorem ExpLaws.exp_two_mul (x : α) : E.exp (2 * x) = E.exp x * E.exp x := by
  rw [← E.exp_add, show x + x = 2 * x by grind]

end Exp

/-- Softmax weights within a factor `exp c_t`: the hypotheses of `tv_le_eform_of_ratio` hold for
`u = exp z`, `v = exp z̃`, `k = exp c` when `|z_t − z̃_t| ≤ c_t`. -/
theorem softmax_tv_eform_general {β : Type} (E : ExpLaws α) (z z' c : β → α) (L : List β)
    (hL : L ≠ []) (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t) :
    tv (softmax E z L) (softmax E z' L) L ≤
      (1 / 2) * (lsum (fun t => softmax E z' L t * E.exp (c t)) L *
        lsum (fun t => softmax E z' L t * E.exp (c t)) L - 1) := by
  have huv : ∀ t ∈ L, E.exp (z t) ≤ E.exp (c t) * E.exp (z' t) := by
    intro t ht
    have h := le_of_absA_le (hc t ht)
    rw [← E.exp_add]
    exact E.exp_le_exp (by grind)
  have hvu : ∀ t ∈ L, E.exp (z' t) ≤ E.exp (c t) * E.exp (z t) := by
    intro t ht
    have h := le_of_absA_le (hc t ht)
    rw [← E.exp_add]
    exact E.exp_le_exp (by grind)
  exact tv_le_eform_of_ratio (fun t => E.exp (z t)) (fun t => E.exp (z' t)) (fun t => E.exp (c t))
    L hL (fun t _ => E.exp_pos _) (fun t _ => E.exp_pos _) (fun t _ => E.exp_pos _) huv hvu

/-- The e-form softmax-to-TV bridge: if every logit moves by at most `ε`
(`|z_t − z̃_t| ≤ ε`), then `TV(softmax z, softmax z̃) ≤ ½ (exp (2ε) − 1)`.
Python: `bridges.softmax_tv_bridge` (e-form). -/
theorem softmax_tv_eform_sound {β : Type} (E : ExpLaws α) (z z' : β → α) (L : List β)
    (hL : L ≠ []) (ε : α) (hε : ∀ t ∈ L, absA (z t - z' t) ≤ ε) :
    tv (softmax E z L) (softmax E z' L) L ≤ (1 / 2) * (E.exp (2 * ε) - 1) := by
  have h : tv (softmax E z L) (softmax E z' L) L ≤
      (1 / 2) * (lsum (fun t => softmax E z' L t * E.exp ε) L *
        lsum (fun t => softmax E z' L t * E.exp ε) L - 1) :=
    softmax_tv_eform_general E z z' (fun _ => ε) L hL hε
  have hA : lsum (fun t => softmax E z' L t * E.exp ε) L = E.exp ε := by
    have h1 : lsum (fun t => softmax E z' L t * E.exp ε) L =
        lsum (fun t => E.exp (z' t) / lsum (fun s => E.exp (z' s)) L * E.exp ε) L := rfl
    have hV : 0 < lsum (fun s => E.exp (z' s)) L := lsum_pos hL (fun t _ => E.exp_pos _)
    have h2 : lsum (fun t => E.exp (z' t) / lsum (fun s => E.exp (z' s)) L * E.exp ε) L =
        lsum (fun t => E.exp ε * E.exp (z' t) / lsum (fun s => E.exp (z' s)) L) L :=
      lsum_congr (fun t _ => by grind)
    rw [h1, h2, lsum_div, lsum_mul_left]
    grind
  rw [hA, ← E.exp_two_mul] at h
  exact h

/-- The affine softmax-to-TV bridge on the domain `ε ≤ ε₀`: if every logit moves by at most
`ε` with `0 ≤ ε ≤ ε₀`, then `TV ≤ exp (2ε₀) · ε`. Python: `bridges.softmax_tv_bridge(eps_max=ε₀)`,
the contract `TV ≤ a · ε` with `a = exp (2ε₀)`. -/
theorem softmax_tv_affine_sound {β : Type} (E : ExpLaws α) (z z' : β → α) (L : List β)
    (hL : L ≠ []) {ε ε₀ : α} (h0 : 0 ≤ ε) (hε₀ : ε ≤ ε₀)
    (hε : ∀ t ∈ L, absA (z t - z' t) ≤ ε) :
    tv (softmax E z L) (softmax E z' L) L ≤ E.exp (2 * ε₀) * ε := by
  have h := softmax_tv_eform_sound E z z' L hL ε hε
  have h1 := E.one_add_le_exp (-(2 * ε))
  have h2 := E.exp_mul_exp_neg (2 * ε)
  have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h1 (Std.le_of_lt (E.exp_pos (2 * ε)))
  have h4 := E.exp_le_exp (show 2 * ε ≤ 2 * ε₀ by grind)
  have h5 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h4 h0
  grind

/-- `(1 − p)^n ≤ exp (−n p)` for `0 ≤ p ≤ 1`. Python: `meters.rate_upper_bound` and
`meters.sentinel_rounds` rely on it. -/
theorem one_sub_pow_le_exp (E : ExpLaws α) {p : α} (_hp0 : 0 ≤ p) (hp1 : p ≤ 1) (n : Nat) :
    (1 - p) ^ n ≤ E.exp (-((n : α) * p)) := by
  induction n with
  | zero =>
    have hc : ((0 : Nat) : α) = 0 := Lean.Grind.Semiring.natCast_zero
    have h0 : E.exp (-(((0 : Nat) : α) * p)) = 1 := by
      rw [show -(((0 : Nat) : α) * p) = 0 by grind]
      exact E.exp_zero
    have hp : (1 - p) ^ 0 = 1 := Lean.Grind.Semiring.pow_zero _
    rw [hp]
    grind
  | succ n ih =>
    have hc : ((n + 1 : Nat) : α) = (n : α) + 1 := Lean.Grind.Semiring.natCast_succ n
    have he := E.exp_add (-((n : α) * p)) (-p)
    rw [show -((n : α) * p) + -p = -(((n + 1 : Nat) : α) * p) by grind] at he
    have h1 := E.one_add_le_exp (-p)
    have hpow := pow_nonneg_of_nonneg (show (0 : α) ≤ 1 - p by grind) n
    have h2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left
      (show 1 - p ≤ E.exp (-p) by grind) hpow
    have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right ih (Std.le_of_lt (E.exp_pos (-p)))
    have hp : (1 - p) ^ (n + 1) = (1 - p) ^ n * (1 - p) := Lean.Grind.Semiring.pow_succ _ _
    rw [hp]
    grind

end WitCert.Analytic

end
