/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Analytic
public import WitCert.Dither
public import WitCert.Meters
public import WitCert.Output

public section

/-!
# Consequences and models of the assumed laws

The analytic theorems of `WitCert` take their exponential, logarithm, hyperbolic cosine and
value norm as explicit structures of laws: `WitCert.Analytic.ExpLaws`,
`WitCert.Analytic.ExpLogLaws`, `WitCert.Dither.CoshLaws` and `WitCert.Output.NormedLaws`. This
file collects sanity consequences of those laws (the familiar shape of `exp`, `log` and `cosh`
follows from them) and the rational brackets they force, and gives a model of `NormedLaws`
over every ordered field, `Rat` included.

## Main definitions

* `WitCert.Laws.scalarNormedLaws`: the carrier itself with `‖x‖ = |x|` satisfies
  `WitCert.Output.NormedLaws`.
* `WitCert.Laws.ratNormedLaws`: the same model over `Rat`.

## Main statements

* `WitCert.Laws.exp_ne_zero`, `WitCert.Laws.exp_neg_eq`, `WitCert.Laws.exp_sub_eq`:
  `exp x ≠ 0`, `exp (−x) = 1 / exp x`, `exp (x − y) = exp x / exp y`.
* `WitCert.Laws.exp_le_exp_iff`, `WitCert.Laws.exp_lt_exp_iff`, `WitCert.Laws.exp_injective`:
  `exp` is a strictly monotone injection.
* `WitCert.Laws.one_le_exp_of_nonneg`, `WitCert.Laws.one_lt_exp_of_pos`,
  `WitCert.Laws.exp_lt_one_of_neg`: `exp` compared with `1`.
* `WitCert.Laws.one_sub_le_exp_neg`, `WitCert.Laws.exp_le_inv_one_sub`: `1 − x ≤ exp (−x)` and
  `exp x ≤ 1/(1 − x)` for `x < 1`: `exp` lies between its tangent line and `1/(1 − x)`.
* `WitCert.Laws.two_le_exp_one`, `WitCert.Laws.exp_half_le_two`,
  `WitCert.Laws.exp_one_le_four`, `WitCert.Laws.exp_neg_one_le_half`,
  `WitCert.Laws.exp_eighth_le`, `WitCert.Laws.exp_quarter_le`,
  `WitCert.Laws.exp_one_lt_three`: rational brackets at concrete points, `2 ≤ exp 1 < 3`.
* `WitCert.Laws.log_one`, `WitCert.Laws.log_mul`, `WitCert.Laws.log_neg_of_lt_one`,
  `WitCert.Laws.log_injective`: the logarithm of `ExpLogLaws` is a logarithm on `(0, ∞)`.
* `WitCert.Laws.cosh_neg`, `WitCert.Laws.one_le_cosh`, `WitCert.Laws.one_add_half_sq_le_exp`:
  the `cosh` of `CoshLaws` is even and at least `1`.
* `WitCert.Laws.absA_mul`: `|c v| = |c| |v|`, the homogeneity of the scalar model.
* `WitCert.Laws.norm_zero_of_laws`: `‖0‖ = 0` follows from the `NormedLaws` fields.

## Implementation notes

No model of `ExpLaws` exists in core Lean: every ordered field contains `Rat`, and the laws
force `exp 1` to lie in the intervals `[(1 + 1/n)^n, (1 + 1/(n − 1))^n]`, whose only common
point in ℝ is `e`. The real exponential of mathlib is a model (see `formal/README.md`,
"Assumed laws and their models", for the mathlib lemmas behind each field). The theorems here
show the laws are coherent with the exponential's usual shape and with its rational brackets;
they do not by themselves construct a model. The rational stand-ins for `exp` in
`WitCert.GeneratedChecks` are inputs to purely algebraic checks and are not claimed to satisfy
these laws.

Where each field of a law structure is used (a model must supply all of them):

* `ExpLaws.exp_add`: `ExpLaws.exp_mul_exp_neg`, `ExpLaws.exp_le_exp`, `ExpLaws.exp_lt_exp`,
  `ExpLaws.exp_two_mul`, `softmax_tv_eform_general`, `one_sub_pow_le_exp`
  (`WitCert/Analytic.lean`); `Meters.exp_le_exp_mul_of_absA`, `Meters.pow_eq_exp_mul_log`
  (`WitCert/Meters.lean`); `Analytic.softmax_tv_tanh_sound` (`WitCert/Sharp.lean`);
  `Dither.signAvg_exp_dot_le` and the moment-generating-function steps of `WitCert/Dither.lean`.
* `ExpLaws.exp_zero`: `ExpLaws.exp_mul_exp_neg`, `one_sub_pow_le_exp`;
  `Meters.page_in_decrease`, `Meters.pow_eq_exp_mul_log`, `Meters.sentinel_rounds_sound`;
  `Analytic.softmax_tv_tanh_sound`; `WitCert/Dither.lean`.
* `ExpLaws.exp_pos`: the monotonicity lemmas, every softmax theorem (`softmax` divides by
  `Σ exp`), `Meters.aPlus_pos`, `Meters.tv_two_sided_sound`, `Meters.tv_retention_sound`,
  `Dither.ind_le_exp`, `Dither.signAvg_exp_dot_le`, `Analytic.softmax_tv_tanh_sound`.
* `ExpLaws.one_add_le_exp`: `ExpLaws.exp_le_exp`, `ExpLaws.exp_lt_exp`,
  `softmax_tv_affine_sound`, `one_sub_pow_le_exp`, `Meters.one_le_exp_of_absA`,
  `Dither.ind_le_exp`.
* `ExpLogLaws.exp_log`: `Meters.pow_eq_exp_mul_log`, `Meters.sentinel_rounds_sound`,
  `Meters.rate_upper_bound_sound`.
* `CoshLaws.cosh_le_exp_half_sq`: `Dither.signAvg_exp_dot_le`, hence `Dither.grid_mgf_le`,
  the Chernoff tails and `Dither.dither_logit_tail`.
* `NormedLaws` (`WitCert/Output.lean`): the vector-space fields in the algebra lemmas of
  `WitCert.Output.NormedLaws` (`add_zero`, `smul_sub_smul`, `vsum_sub`, …); `norm_add_le` and
  `norm_smul` in `norm_vsum_le` and `Meters.output_error_bound_vector_sound`. `norm_nonneg` is
  not used by any proof.
-/

namespace WitCert.Laws

open WitCert.Analytic

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α]

/-! ### Identities that use no order -/

/-- `log` is injective on `(0, ∞)`. -/
theorem log_injective (E : ExpLogLaws α) {x y : α} (hx : 0 < x) (hy : 0 < y)
    (h : E.log x = E.log y) : x = y := by
  rw [← E.exp_log x hx, ← E.exp_log y hy, h]

/-- `cosh` is even: `cosh (−y) = cosh y`, with `cosh y = (exp y + exp (−y))/2`. -/
theorem cosh_neg (E : Dither.CoshLaws α) (y : α) :
    (E.exp (-y) + E.exp (-(-y))) / 2 = (E.exp y + E.exp (-y)) / 2 := by
  rw [show -(-y) = y by grind]
  grind

variable [Std.LawfulOrderLT α] [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-! ### The exponential -/

section Exp

variable (E : ExpLaws α)

/-- `exp x ≠ 0`. -/
theorem exp_ne_zero (x : α) : E.exp x ≠ 0 := by
  have := E.exp_pos x
  grind

/-- `exp (−x) = 1 / exp x`. -/
theorem exp_neg_eq (x : α) : E.exp (-x) = 1 / E.exp x := by
  have h := E.exp_mul_exp_neg x
  have h0 := exp_ne_zero E x
  grind

/-- `exp (x − y) = exp x / exp y`. -/
theorem exp_sub_eq (x y : α) : E.exp (x - y) = E.exp x / E.exp y := by
  have h := E.exp_add x (-y)
  rw [show x + -y = x - y by grind] at h
  have h1 := exp_neg_eq E y
  have h0 := exp_ne_zero E y
  grind

/-- `exp` is injective. -/
theorem exp_injective {x y : α} (h : E.exp x = E.exp y) : x = y := by
  rcases Std.le_total (a := x) (b := y) with hxy | hxy
  · exact Classical.byContradiction fun hne => by
      have := E.exp_lt_exp (show x < y by grind)
      grind
  · exact Classical.byContradiction fun hne => by
      have := E.exp_lt_exp (show y < x by grind)
      grind

/-- `exp` is monotone and reflects `≤`: `exp x ≤ exp y ↔ x ≤ y`. -/
theorem exp_le_exp_iff {x y : α} : E.exp x ≤ E.exp y ↔ x ≤ y := by
  constructor
  · intro h
    exact Classical.byContradiction fun hn => by
      have := E.exp_lt_exp (show y < x by grind)
      grind
  · exact E.exp_le_exp

/-- `exp` is strictly monotone and reflects `<`: `exp x < exp y ↔ x < y`. -/
theorem exp_lt_exp_iff {x y : α} : E.exp x < E.exp y ↔ x < y := by
  constructor
  · intro h
    exact Classical.byContradiction fun hn => by
      have := E.exp_le_exp (show y ≤ x by grind)
      grind
  · exact E.exp_lt_exp

/-- `1 ≤ exp x` for `0 ≤ x`. -/
theorem one_le_exp_of_nonneg {x : α} (h : 0 ≤ x) : 1 ≤ E.exp x := by
  have := E.one_add_le_exp x
  grind

/-- `1 < exp x` for `0 < x`. -/
theorem one_lt_exp_of_pos {x : α} (h : 0 < x) : 1 < E.exp x := by
  have := E.one_add_le_exp x
  grind

/-- `exp x < 1` for `x < 0`. -/
theorem exp_lt_one_of_neg {x : α} (h : x < 0) : E.exp x < 1 := by
  have := E.exp_lt_exp h
  rw [E.exp_zero] at this
  exact this

/-- The tangent line at `0` below `exp (−x)`: `1 − x ≤ exp (−x)`. -/
theorem one_sub_le_exp_neg (x : α) : 1 - x ≤ E.exp (-x) := by
  have := E.one_add_le_exp (-x)
  grind

/-- The upper bracket: `exp x ≤ 1 / (1 − x)` for `x < 1`. -/
theorem exp_le_inv_one_sub {x : α} (hx : x < 1) : E.exp x ≤ 1 / (1 - x) := by
  have h1 := one_sub_le_exp_neg E x
  have h2 := E.exp_mul_exp_neg x
  have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h1 (Std.le_of_lt (E.exp_pos x))
  have hpos : (0 : α) < 1 - x := by grind
  apply le_of_mul_le_mul_left_pos hpos
  have h4 : (1 - x) * (1 / (1 - x)) = 1 := by
    have : (1 : α) - x ≠ 0 := by grind
    grind
  grind

/-- The lower bracket at `1`: `2 ≤ exp 1`. -/
theorem two_le_exp_one : (2 : α) ≤ E.exp 1 := by
  have := E.one_add_le_exp 1
  grind

/-- The upper bracket at `1/2`: `exp (1/2) ≤ 2`. -/
theorem exp_half_le_two : E.exp (1 / 2) ≤ (2 : α) := by
  have h := exp_le_inv_one_sub E (x := (1 / 2 : α)) (by grind)
  have e : (1 : α) / (1 - 1 / 2) = 2 := by grind
  rw [e] at h
  exact h

/-- Squaring preserves `≤` between nonnegative elements. -/
theorem mul_self_le_mul_self {a b : α} (ha : 0 ≤ a) (h : a ≤ b) : a * a ≤ b * b := by
  have h1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h ha
  have hb : 0 ≤ b := by grind
  have h2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right h hb
  grind

/-- `exp x = exp (x/2)²`. -/
theorem exp_eq_mul_self_half (x : α) : E.exp x = E.exp (x / 2) * E.exp (x / 2) := by
  rw [← E.exp_add, show x / 2 + x / 2 = x by grind]

/-- The upper bracket at `1`: `exp 1 ≤ 4`, from `exp (1/2) ≤ 2`. -/
theorem exp_one_le_four : E.exp 1 ≤ (4 : α) := by
  have h := mul_self_le_mul_self (Std.le_of_lt (E.exp_pos (1 / 2))) (exp_half_le_two E)
  rw [exp_eq_mul_self_half E 1]
  grind

/-- The upper bracket at `−1`: `exp (−1) ≤ 1/2`, from `2 ≤ exp 1`. -/
theorem exp_neg_one_le_half : E.exp (-1) ≤ (1 / 2 : α) := by
  have h1 := two_le_exp_one E
  have h2 := E.exp_mul_exp_neg 1
  have h3 := E.exp_pos (-1)
  have h4 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right h1 (Std.le_of_lt h3)
  grind

/-- The upper bracket at `1/8`: `exp (1/8) ≤ 8/7`. -/
theorem exp_eighth_le : E.exp (1 / 8) ≤ (8 / 7 : α) := by
  have h := exp_le_inv_one_sub E (x := (1 / 8 : α)) (by grind)
  have e : (1 : α) / (1 - 1 / 8) = 8 / 7 := by grind
  rw [e] at h
  exact h

/-- The upper bracket at `1/4`: `exp (1/4) ≤ (8/7)²`, from `exp (1/8) ≤ 8/7`. -/
theorem exp_quarter_le : E.exp (1 / 4) ≤ (8 / 7 : α) * (8 / 7) := by
  have h := mul_self_le_mul_self (Std.le_of_lt (E.exp_pos (1 / 8))) (exp_eighth_le E)
  rw [exp_eq_mul_self_half E (1 / 4), show (1 / 4 : α) / 2 = 1 / 8 by grind]
  exact h

/-- The upper bracket at `1`: `exp 1 < 3`, from `exp 1 = exp (1/8)^8 ≤ (8/7)^8 < 3`. -/
theorem exp_one_lt_three : E.exp 1 < (3 : α) := by
  have h4 := exp_quarter_le E
  have e2 := exp_eq_mul_self_half E (1 / 2)
  rw [show (1 / 2 : α) / 2 = 1 / 4 by grind] at e2
  have h2 := mul_self_le_mul_self (Std.le_of_lt (E.exp_pos (1 / 4))) h4
  rw [← e2] at h2
  have e1 := exp_eq_mul_self_half E 1
  have h1 := mul_self_le_mul_self (Std.le_of_lt (E.exp_pos (1 / 2))) h2
  rw [← e1] at h1
  grind

end Exp

/-! ### The logarithm -/

section Log

variable (E : ExpLogLaws α)

/-- `log 1 = 0`. -/
theorem log_one : E.log 1 = 0 := by
  apply exp_injective E.toExpLaws
  rw [E.exp_log 1 (by grind), E.exp_zero]

/-- `log (x y) = log x + log y` for `0 < x`, `0 < y`. -/
theorem log_mul {x y : α} (hx : 0 < x) (hy : 0 < y) : E.log (x * y) = E.log x + E.log y := by
  apply exp_injective E.toExpLaws
  rw [E.exp_add, E.exp_log x hx, E.exp_log y hy,
    E.exp_log (x * y) (Lean.Grind.OrderedRing.mul_pos hx hy)]

/-- `log x < 0` for `0 < x < 1`. -/
theorem log_neg_of_lt_one {x : α} (hx0 : 0 < x) (hx1 : x < 1) : E.log x < 0 := by
  apply (exp_lt_exp_iff E.toExpLaws).mp
  rw [E.exp_log x hx0, E.exp_zero]
  exact hx1

end Log

/-! ### The hyperbolic cosine -/

section Cosh

variable (E : Dither.CoshLaws α)

/-- `1 ≤ cosh y`, from the two tangent lines `1 + y ≤ exp y` and `1 − y ≤ exp (−y)`. -/
theorem one_le_cosh (y : α) : 1 ≤ (E.exp y + E.exp (-y)) / 2 := by
  have h1 := E.one_add_le_exp y
  have h2 := E.one_add_le_exp (-y)
  grind

/-- The law `cosh y ≤ exp (y²/2)` is consistent with the tangent line: both sides are at
least `1`, and `1 + y²/2 ≤ exp (y²/2)`. -/
theorem one_add_half_sq_le_exp (y : α) :
    1 ≤ (E.exp y + E.exp (-y)) / 2 ∧ 1 + y * y / 2 ≤ E.exp (y * y / 2) :=
  ⟨one_le_cosh E y, E.one_add_le_exp (y * y / 2)⟩

/-- A consequence of the law: `exp y ≤ 2 exp (y²/2)`. -/
theorem exp_le_two_mul_exp_half_sq (y : α) : E.exp y ≤ 2 * E.exp (y * y / 2) := by
  have h1 := E.cosh_le_exp_half_sq y
  have h2 := E.exp_pos (-y)
  grind

end Cosh

/-! ### The value norm -/

section Normed

/-- `|c · v| = |c| |v|` in the carrier. -/
theorem absA_mul (c v : α) : absA (c * v) = absA c * absA v := by
  rcases Std.le_total (a := 0) (b := c) with hc | hc <;>
    rcases Std.le_total (a := 0) (b := v) with hv | hv
  · have h := Lean.Grind.OrderedRing.mul_nonneg hc hv
    rw [Meters.absA_of_nonneg h, Meters.absA_of_nonneg hc, Meters.absA_of_nonneg hv]
  · have h := Lean.Grind.OrderedRing.mul_nonpos_of_nonneg_of_nonpos hc hv
    rw [Meters.absA_of_nonpos h, Meters.absA_of_nonneg hc, Meters.absA_of_nonpos hv]
    grind
  · have h := Lean.Grind.OrderedRing.mul_nonpos_of_nonneg_of_nonpos hv hc
    rw [Meters.absA_of_nonpos (show c * v ≤ 0 by grind), Meters.absA_of_nonpos hc,
      Meters.absA_of_nonneg hv]
    grind
  · have h := Lean.Grind.OrderedRing.mul_nonneg (show 0 ≤ -c by grind) (show 0 ≤ -v by grind)
    rw [Meters.absA_of_nonneg (show 0 ≤ c * v by grind), Meters.absA_of_nonpos hc,
      Meters.absA_of_nonpos hv]
    grind

/-- The carrier with `‖x‖ = |x|` is a model of `WitCert.Output.NormedLaws`: every field holds
in every ordered field. -/
noncomputable def scalarNormedLaws : Output.NormedLaws α α where
  add := fun u v => u + v
  zero := 0
  neg := fun v => -v
  sub := fun u v => u - v
  smul := fun c v => c * v
  norm := absA
  add_assoc := fun u v w => by (try dsimp only); grind
  add_comm := fun u v => by (try dsimp only); grind
  zero_add := fun v => by (try dsimp only); grind
  neg_add_cancel := fun v => by (try dsimp only); grind
  sub_eq_add_neg := fun u v => by (try dsimp only); grind
  smul_add := fun c u v => by (try dsimp only); grind
  add_smul := fun a b v => by (try dsimp only); grind
  norm_nonneg := fun v => Output.zero_le_absA v
  norm_add_le := fun u v => Meters.absA_add_le u v
  norm_smul := fun c v => absA_mul c v

/-- `NormedLaws` has a model over `Rat`: its hypotheses are satisfiable in core Lean. -/
noncomputable def ratNormedLaws : Output.NormedLaws Rat Rat := scalarNormedLaws

variable {V : Type} (N : Output.NormedLaws α V)

/-- `‖0‖ = 0` follows from the fields of `NormedLaws`. -/
theorem norm_zero_of_laws : N.norm N.zero = 0 := Output.NormedLaws.norm_zero N

end Normed

end WitCert.Laws

end
