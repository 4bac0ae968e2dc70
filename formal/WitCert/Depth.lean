/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Analytic
public import WitCert.Output
public import WitCert.Sharp

/-!
# Error propagation through one pre-norm transformer layer

An error in the residual stream at the current token is followed through the steps of one
pre-norm layer (`x ↦ x + f (norm x)` for the attention and the MLP sublayers) and into the
next-token distribution. Each step is a Lipschitz-type bound in a normed space
`N : WitCert.Output.NormedLaws α V`; the softmax steps reuse the sharp bound `tanh (osc/4)` of
`WitCert.Analytic.softmax_tv_tanh_sound`.

## Main statements

* RMSNorm. `WitCert.Depth.le_of_mul_self_eq_add`: `a² = s² + c` with `a, c ≥ 0` gives `s ≤ a`;
  `WitCert.Depth.abs_sub_le_of_mul_self_eq`: `a² = s² + c`, `b² = t² + c` (all nonnegative)
  give `|a − b| ≤ |s − t|`; `WitCert.Depth.norm_smul_inv_sub_le`: `‖y‖ ≤ b` and
  `|a − b| ≤ ‖x − y‖` give `‖x/a − y/b‖ ≤ 2 ‖x − y‖/a`;
  `WitCert.Depth.rms_normalize_lipschitz`: with `a² = ‖x‖² + c` and `b² = ‖y‖² + c`,
  `‖x/a − y/b‖ ≤ 2 ‖x − y‖/a`.
* Residual connection. `WitCert.Depth.residual_step_le`: `‖(x + f x) − (x' + g x')‖ ≤
  ‖x − x'‖ + ‖f x − g x'‖`; `WitCert.Depth.lipschitz_comp_le`: Lipschitz constants multiply
  under composition; `WitCert.Depth.served_map_le`: an `L`-Lipschitz map served within `η`
  moves by at most `L ‖x − x'‖ + η`.
* Attention. `WitCert.Depth.softmax_tv_le_tanh_shift`: logit shifts within `D` of a common
  shift `m` give `TV ≤ tanh (D/2)`; `WitCert.Depth.attn_query_step_le`: the attention output
  moves by at most `2 M tanh (D/2) + ρ` (`‖v_t‖ ≤ M`, `‖v_t − w_t‖ ≤ ρ`).
* `tanh`. `WitCert.Depth.tanhE_nonneg`, `WitCert.Depth.tanhE_le_one`,
  `WitCert.Depth.tanhE_le_two_mul` (`tanh y ≤ 2y` for `y ≥ 0`).
* Gated MLP. `WitCert.Depth.hadamard_sq_le`, `WitCert.Depth.lipschitz_sq_le`,
  `WitCert.Depth.coord_sq_le_sum` (coordinate sums of squares);
  `WitCert.Depth.glu_step_le`: `‖φ(a) ⊙ b − φ(a') ⊙ b'‖ ≤ L_φ B ‖a − a'‖ +
  (P + L_φ ‖a − a'‖) ‖b − b'‖`.
* Next-token head. `WitCert.Depth.next_token_tv_le`: vocabulary logit shifts within `R e` of a
  common shift give `TV ≤ tanh (R e/2)`.

## Implementation notes

The carrier `α` is that of `WitCert.Analytic` (core's ordered-field classes) and the vectors
those of `WitCert.Output.NormedLaws`. Two statements use one more vector-space law, stated as a
hypothesis: `1 • v = v` (every real vector space satisfies it); with it, `‖−v‖ = ‖v‖` and the
reverse triangle inequality follow. Squares are written `x * x`, and the Euclidean norms of the
gated-MLP coordinate lemmas are squared, so no square root is taken. The Hadamard product of the
gated MLP is an abstract map with the bilinear split of its difference as a hypothesis; the
coordinate lemmas justify the remaining hypotheses for the Euclidean norm.

Each theorem keeps the section's whole carrier context, classes its proof does not use
included: they are part of its statement as exported and locked (`formal/statements.lock.json`).
Where one goes unused, the `unusedSectionVars` linter is switched off for that theorem alone.
-/

@[expose] public section

namespace WitCert.Depth

open WitCert.Analytic WitCert.Output

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-! ### Scalar facts -/

/-- `x² ≥ 0`, as `0 ≤ x * x`. -/
theorem mul_self_nonneg (x : α) : 0 ≤ x * x := by
  have := Lean.Grind.OrderedRing.sq_nonneg (a := x)
  grind

/-- `|x| ≤ B` gives `x² ≤ B²`. -/
theorem mul_self_le_of_absA_le {x B : α} (h : absA x ≤ B) : x * x ≤ B * B := by
  have h1 := le_of_absA_le h
  have h2 := Lean.Grind.OrderedRing.mul_nonneg (show 0 ≤ B - x by grind)
    (show 0 ≤ B + x by grind)
  grind

/-- `s ≤ a` when `a² = s² + c` with `a ≥ 0` and `c ≥ 0`. -/
theorem le_of_mul_self_eq_add {a s c : α} (ha : 0 ≤ a) (hc : 0 ≤ c) (h : a * a = s * s + c) :
    s ≤ a :=
  Classical.byContradiction fun hn => by
    have h1 : a < s := by grind
    have h2 := Lean.Grind.OrderedRing.mul_lt_mul_of_pos_left h1 (show 0 < s by grind)
    have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (Std.le_of_lt h1) ha
    grind

/-- The RMSNorm scalar step: if `a² = s² + c` and `b² = t² + c` with `a, b, s, t, c ≥ 0`, then
`|a − b| ≤ |s − t|`. -/
theorem abs_sub_le_of_mul_self_eq {a b s t c : α} (ha : 0 ≤ a) (hb : 0 ≤ b) (hs : 0 ≤ s)
    (ht : 0 ≤ t) (hc : 0 ≤ c) (hsa : a * a = s * s + c) (htb : b * b = t * t + c) :
    absA (a - b) ≤ absA (s - t) := by
  have h1 := le_of_mul_self_eq_add ha hc hsa
  have h2 := le_of_mul_self_eq_add hb hc htb
  have e : (a - b) * (a + b) = (s - t) * (s + t) := by grind
  rcases Classical.em (a + b = 0) with h0 | h0
  · have ea : a - b = 0 := by grind
    rw [ea, absA_of_nonneg (show (0 : α) ≤ 0 by grind)]
    exact absA_nonneg _
  · have hp : 0 < a + b := by grind
    have k1 := absA_mul_of_nonneg (x := a - b) (Std.le_of_lt hp)
    have k2 := absA_mul_of_nonneg (x := s - t) (show 0 ≤ s + t by grind)
    rw [e] at k1
    have k3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left
      (show s + t ≤ a + b by grind) (absA_nonneg (s - t))
    apply le_of_mul_le_mul_left_pos hp
    grind

/-! ### Vectors -/

section Vectors

variable {V : Type}

/-- `x − x = 0`. -/
theorem sub_self_eq_zero (N : NormedLaws α V) (x : V) : N.sub x x = N.zero := by
  rw [N.sub_eq_add_neg, N.add_neg]

/-- The triangle inequality through a point: `‖x − z‖ ≤ ‖x − y‖ + ‖y − z‖`. -/
theorem norm_sub_le_add (N : NormedLaws α V) (x y z : V) :
    N.norm (N.sub x z) ≤ N.norm (N.sub x y) + N.norm (N.sub y z) := by
  have e : N.sub x z = N.add (N.sub x y) (N.sub y z) := by
    rw [N.sub_eq_add_neg x z, N.sub_eq_add_neg x y, N.sub_eq_add_neg y z,
      N.add_assoc x (N.neg y) (N.add y (N.neg z)), ← N.add_assoc (N.neg y) y (N.neg z),
      N.neg_add_cancel, N.zero_add]
  rw [e]
  exact N.norm_add_le _ _

/-- `‖c • x − d • y‖ ≤ |c| ‖x − y‖ + |c − d| ‖y‖`. -/
theorem norm_smul_sub_smul_le (N : NormedLaws α V) (c d : α) (x y : V) :
    N.norm (N.sub (N.smul c x) (N.smul d y)) ≤
      absA c * N.norm (N.sub x y) + absA (c - d) * N.norm y := by
  have h1 := norm_sub_le_add N (N.smul c x) (N.smul c y) (N.smul d y)
  have h2 : N.norm (N.sub (N.smul c x) (N.smul c y)) ≤ absA c * N.norm (N.sub x y) := by
    rw [N.smul_sub_smul]
    have a1 := N.norm_add_le (N.smul (c - c) x) (N.smul c (N.sub x y))
    rw [N.norm_smul (c - c), N.norm_smul c, show c - c = 0 by grind,
      absA_of_nonneg (show (0 : α) ≤ 0 by grind)] at a1
    grind
  have h3 : N.norm (N.sub (N.smul c y) (N.smul d y)) ≤ absA (c - d) * N.norm y := by
    rw [N.smul_sub_smul, sub_self_eq_zero N y]
    have a1 := N.norm_add_le (N.smul (c - d) y) (N.smul d N.zero)
    rw [N.norm_smul (c - d), N.norm_smul d, N.norm_zero] at a1
    grind
  grind

/-- The division step of RMSNorm: for `a, b > 0` with `‖y‖ ≤ b` and `|a − b| ≤ ‖x − y‖`,
`‖x/a − y/b‖ ≤ 2 ‖x − y‖/a`. From `x/a − y/b = (x − y)/a + (1/a − 1/b) y` and
`‖y‖ |1/a − 1/b| = (‖y‖/b) |b − a|/a`. -/
theorem norm_smul_inv_sub_le (N : NormedLaws α V) (x y : V) {a b : α} (ha : 0 < a)
    (hb : 0 < b) (hy : N.norm y ≤ b) (hab : absA (a - b) ≤ N.norm (N.sub x y)) :
    N.norm (N.sub (N.smul (1 / a) x) (N.smul (1 / b) y)) ≤ 2 * N.norm (N.sub x y) / a := by
  have hia := inv_pos_of_pos ha
  have hib := inv_pos_of_pos hb
  have ea : a * a⁻¹ = 1 := by grind
  have eb : b * b⁻¹ = 1 := by grind
  have hba : absA (b - a) ≤ N.norm (N.sub x y) := by
    have := le_of_absA_le hab
    exact absA_le (by grind) (by grind)
  have hg := norm_smul_sub_smul_le N (1 / a) (1 / b) x y
  have e1 : 1 / a - 1 / b = (b - a) * (a⁻¹ * b⁻¹) := by
    have : (b - a) * (a⁻¹ * b⁻¹) = a⁻¹ * (b * b⁻¹) - b⁻¹ * (a * a⁻¹) := by grind
    rw [this, ea, eb]
    grind
  have hc : 0 ≤ a⁻¹ * b⁻¹ := Std.le_of_lt (Lean.Grind.OrderedRing.mul_pos hia hib)
  rw [e1, absA_mul_of_nonneg hc, absA_of_nonneg (show 0 ≤ 1 / a by grind)] at hg
  have hK : 0 ≤ absA (b - a) * (a⁻¹ * b⁻¹) :=
    Lean.Grind.OrderedRing.mul_nonneg (absA_nonneg _) hc
  have k1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hy hK
  have e2 : absA (b - a) * (a⁻¹ * b⁻¹) * b = absA (b - a) * a⁻¹ * (b * b⁻¹) := by grind
  rw [eb] at e2
  have k2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right hba (Std.le_of_lt hia)
  have e3 : 2 * N.norm (N.sub x y) / a = 2 * (N.norm (N.sub x y) * a⁻¹) := by grind
  have e4 : 1 / a * N.norm (N.sub x y) = N.norm (N.sub x y) * a⁻¹ := by grind
  rw [e3]
  grind

/-- `‖−v‖ = ‖v‖`, for laws with `1 • v = v`. -/
theorem norm_neg_eq (N : NormedLaws α V) (hone : ∀ v, N.smul 1 v = v) (v : V) :
    N.norm (N.neg v) = N.norm v := by
  have h0 : N.smul 0 v = N.zero := by
    apply N.eq_zero_of_add_self
    rw [← N.add_smul, show (0 : α) + 0 = 0 by grind]
  have h1 : N.add v (N.smul (-1) v) = N.zero := by
    have e := N.add_smul 1 (-1) v
    rw [hone v, show (1 : α) + -1 = 0 by grind, h0] at e
    exact e.symm
  have h2 := N.eq_neg_of_add_eq_zero h1
  rw [← h2, N.norm_smul, absA_of_nonpos (show (-1 : α) ≤ 0 by grind)]
  grind

/-- `‖x − y‖ = ‖y − x‖`, for laws with `1 • v = v`. -/
theorem norm_sub_comm (N : NormedLaws α V) (hone : ∀ v, N.smul 1 v = v) (x y : V) :
    N.norm (N.sub x y) = N.norm (N.sub y x) := by
  have h : N.sub y x = N.neg (N.sub x y) := by
    apply N.eq_neg_of_add_eq_zero
    rw [← sub_self_eq_zero N x]
    rw [N.sub_eq_add_neg x y, N.sub_eq_add_neg y x, N.sub_eq_add_neg x x,
      N.add_assoc x (N.neg y) (N.add y (N.neg x)), ← N.add_assoc (N.neg y) y (N.neg x),
      N.neg_add_cancel, N.zero_add]
  rw [h, norm_neg_eq N hone]

/-- The reverse triangle inequality `|‖x‖ − ‖y‖| ≤ ‖x − y‖`, for laws with `1 • v = v`. -/
theorem abs_norm_sub_norm_le (N : NormedLaws α V) (hone : ∀ v, N.smul 1 v = v) (x y : V) :
    absA (N.norm x - N.norm y) ≤ N.norm (N.sub x y) := by
  have hz : ∀ u : V, N.sub u N.zero = u := fun u => by
    rw [N.sub_eq_add_neg, N.neg_zero, N.add_zero]
  have h1 := norm_sub_le_add N x y N.zero
  have h2 := norm_sub_le_add N y x N.zero
  rw [hz, hz] at h1 h2
  rw [norm_sub_comm N hone y x] at h2
  exact absA_le (by grind) (by grind)

/-- RMSNorm is Lipschitz away from zero: with `a² = ‖x‖² + c`, `b² = ‖y‖² + c`, `a, b > 0` and
`c ≥ 0`, `‖x/a − y/b‖ ≤ 2 ‖x − y‖/a`. Python: the RMSNorm step
`u(x) = √d · x / √(‖x‖² + d ε)`, `‖u(x) − u(y)‖ ≤ 2 ‖x − y‖/rms_ε(x)`. -/
theorem rms_normalize_lipschitz (N : NormedLaws α V) (hone : ∀ v, N.smul 1 v = v) (x y : V)
    {a b c : α} (ha : 0 < a) (hb : 0 < b) (hc : 0 ≤ c)
    (hax : a * a = N.norm x * N.norm x + c) (hby : b * b = N.norm y * N.norm y + c) :
    N.norm (N.sub (N.smul (1 / a) x) (N.smul (1 / b) y)) ≤ 2 * N.norm (N.sub x y) / a := by
  have hy := le_of_mul_self_eq_add (Std.le_of_lt hb) hc hby
  have h1 := abs_sub_le_of_mul_self_eq (Std.le_of_lt ha) (Std.le_of_lt hb) (N.norm_nonneg x)
    (N.norm_nonneg y) hc hax hby
  have h2 := abs_norm_sub_norm_le N hone x y
  exact norm_smul_inv_sub_le N x y ha hb hy (by grind)

/-! ### Residual connections and Lipschitz maps -/

/-- The residual connection adds the input error: `‖(x + f x) − (x' + g x')‖ ≤ ‖x − x'‖ +
‖f x − g x'‖`. -/
theorem residual_step_le (N : NormedLaws α V) (f g : V → V) (x x' : V) :
    N.norm (N.sub (N.add x (f x)) (N.add x' (g x'))) ≤
      N.norm (N.sub x x') + N.norm (N.sub (f x) (g x')) := by
  rw [N.sub_add_add]
  exact N.norm_add_le _ _

/-- Lipschitz constants multiply under composition: if `‖f u − f v‖ ≤ L ‖u − v‖` (e.g. a linear
map whose operator norm is at most `L`) and `‖g u − g v‖ ≤ K ‖u − v‖`, with `L ≥ 0`, then
`‖f (g x) − f (g y)‖ ≤ L K ‖x − y‖`. -/
theorem lipschitz_comp_le (N : NormedLaws α V) (f g : V → V) {L K : α} (hL : 0 ≤ L)
    (hf : ∀ u v, N.norm (N.sub (f u) (f v)) ≤ L * N.norm (N.sub u v))
    (hg : ∀ u v, N.norm (N.sub (g u) (g v)) ≤ K * N.norm (N.sub u v)) (x y : V) :
    N.norm (N.sub (f (g x)) (f (g y))) ≤ L * K * N.norm (N.sub x y) := by
  have h1 := hf (g x) (g y)
  have h2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (hg x y) hL
  grind

/-- An `L`-Lipschitz map `f` served as `g` within `η` (`‖f v − g v‖ ≤ η` for every `v`):
`‖f x − g x'‖ ≤ L ‖x − x'‖ + η`. The transfer of the served sublayer in a residual step. -/
theorem served_map_le (N : NormedLaws α V) (f g : V → V) {L η : α}
    (hf : ∀ u v, N.norm (N.sub (f u) (f v)) ≤ L * N.norm (N.sub u v))
    (hη : ∀ v, N.norm (N.sub (f v) (g v)) ≤ η) (x x' : V) :
    N.norm (N.sub (f x) (g x')) ≤ L * N.norm (N.sub x x') + η := by
  have h1 := norm_sub_le_add N (f x) (f x') (g x')
  have h2 := hf x x'
  have h3 := hη x'
  grind

end Vectors

/-! ### `tanh` -/

/-- `tanh y ≥ 0` for `y ≥ 0`. -/
theorem tanhE_nonneg (E : ExpLaws α) {y : α} (hy : 0 ≤ y) : 0 ≤ tanhE E y := by
  have hX : 1 ≤ E.exp (2 * y) := by
    have := E.exp_le_exp (show (0 : α) ≤ 2 * y by grind)
    rw [E.exp_zero] at this
    exact this
  have hu := inv_pos_of_pos (show 0 < E.exp (2 * y) + 1 by grind)
  have h := Lean.Grind.OrderedRing.mul_nonneg (show 0 ≤ E.exp (2 * y) - 1 by grind)
    (Std.le_of_lt hu)
  unfold tanhE
  grind

/-- `tanh y ≤ 1`. -/
theorem tanhE_le_one (E : ExpLaws α) (y : α) : tanhE E y ≤ 1 := by
  have hX := E.exp_pos (2 * y)
  have hu := inv_pos_of_pos (show 0 < E.exp (2 * y) + 1 by grind)
  have e1 : (E.exp (2 * y) + 1) * (E.exp (2 * y) + 1)⁻¹ = 1 := by grind
  have h := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right
    (show E.exp (2 * y) - 1 ≤ E.exp (2 * y) + 1 by grind) (Std.le_of_lt hu)
  unfold tanhE
  grind

/-- `tanh y ≤ 2y` for `y ≥ 0`: from `exp (−2y) ≥ 1 − 2y`, `exp (2y) − 1 ≤ 2y exp (2y)`. -/
theorem tanhE_le_two_mul (E : ExpLaws α) {y : α} (hy : 0 ≤ y) : tanhE E y ≤ 2 * y := by
  have hX := E.exp_pos (2 * y)
  have h1 := E.one_add_le_exp (-(2 * y))
  have h2 := E.exp_mul_exp_neg (2 * y)
  have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h1 (Std.le_of_lt hX)
  have hu := inv_pos_of_pos (show 0 < E.exp (2 * y) + 1 by grind)
  have e1 : (E.exp (2 * y) + 1) * (E.exp (2 * y) + 1)⁻¹ = 1 := by grind
  have h4 : E.exp (2 * y) - 1 ≤ 2 * y * (E.exp (2 * y) + 1) := by grind
  have h5 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right h4 (Std.le_of_lt hu)
  have e2 : 2 * y * (E.exp (2 * y) + 1) * (E.exp (2 * y) + 1)⁻¹ =
      2 * y * ((E.exp (2 * y) + 1) * (E.exp (2 * y) + 1)⁻¹) := by grind
  rw [e1] at e2
  unfold tanhE
  grind

/-! ### Softmax steps: attention and the next-token head -/

/-- Softmax weights sum to one over a nonempty list. -/
theorem softmax_lsum_eq_one {β : Type} (E : ExpLaws α) (z : β → α) (L : List β)
    (hL : L ≠ []) : lsum (fun t => softmax E z L t) L = 1 := by
  have hZ : 0 < lsum (fun s => E.exp (z s)) L := lsum_pos hL (fun t _ => E.exp_pos _)
  have h := lsum_div (fun t => E.exp (z t)) (lsum (fun s => E.exp (z s)) L) L
  show lsum (fun t => E.exp (z t) / lsum (fun s => E.exp (z s)) L) L = 1
  rw [h]
  grind

/-- Softmax weights are positive over a nonempty list. -/
theorem softmax_pos {β : Type} (E : ExpLaws α) (z : β → α) (L : List β) (hL : L ≠ [])
    (t : β) : 0 < softmax E z L t :=
  div_pos_of_pos (E.exp_pos _) (lsum_pos hL (fun _ _ => E.exp_pos _))

/-- Logit shifts within `D` of a common shift `m` (`|(z'_t − z_t) − m| ≤ D`) give
`TV(softmax z, softmax z') ≤ tanh (D/2)`: the oscillation of the shifts is at most `2D`. -/
theorem softmax_tv_le_tanh_shift {β : Type} (E : ExpLaws α) (z z' : β → α) (L : List β)
    (hL : L ≠ []) {m D : α} (h : ∀ t ∈ L, absA ((z' t - z t) - m) ≤ D) :
    tv (softmax E z L) (softmax E z' L) L ≤ tanhE E (D / 2) := by
  have k := softmax_tv_tanh_sound E z z' L hL (m := m - D) (M := m + D)
    (fun t ht => by have := le_of_absA_le (h t ht); grind)
    (fun t ht => by have := le_of_absA_le (h t ht); grind)
  rw [show (m + D - (m - D)) / 4 = D / 2 by grind] at k
  exact k

/-- Attention with the query side perturbed, exact cache: if every logit shift is within `D` of
a common shift `m`, `‖v_t‖ ≤ M` and `‖v_t − w_t‖ ≤ ρ` for every token, then the attention
outputs `Σ_t softmax z t • v_t` and `Σ_t softmax z' t • w_t` differ by at most
`2 M tanh (D/2) + ρ`. From `WitCert.Meters.output_error_bound_vector_sound`. -/
theorem attn_query_step_le {V β : Type} (E : ExpLaws α) (N : NormedLaws α V) (L : List β)
    (hL : L ≠ []) (z z' : β → α) (v w : β → V) {m D M ρ : α}
    (hz : ∀ t ∈ L, absA ((z' t - z t) - m) ≤ D) (hv : ∀ t ∈ L, N.norm (v t) ≤ M)
    (hvw : ∀ t ∈ L, N.norm (N.sub (v t) (w t)) ≤ ρ) :
    N.norm (N.sub (N.vsum (fun t => N.smul (softmax E z L t) (v t)) L)
        (N.vsum (fun t => N.smul (softmax E z' L t) (w t)) L)) ≤
      2 * M * tanhE E (D / 2) + ρ := by
  have h := Meters.output_error_bound_vector_sound N (softmax E z L) (softmax E z' L) v w
    (fun _ => ρ) L M hv hvw (fun t _ => Std.le_of_lt (softmax_pos E z' L hL t))
  have htv := softmax_tv_le_tanh_shift E z z' L hL hz
  have hM : 0 ≤ M := by
    cases L with
    | nil => exact absurd rfl hL
    | cons t _ =>
      have := hv t (by simp)
      have := N.norm_nonneg (v t)
      grind
  have hs : lsum (fun t => softmax E z' L t * ρ) L = ρ := by
    have e := lsum_mul_left ρ (fun t => softmax E z' L t) L
    rw [softmax_lsum_eq_one E z' L hL] at e
    rw [← show lsum (fun t => ρ * softmax E z' L t) L = lsum (fun t => softmax E z' L t * ρ) L
      from lsum_congr (fun t _ => by grind)]
    grind
  have k := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left htv
    (show 0 ≤ 2 * M by grind)
  grind

/-- The next-token head: if every vocabulary logit shift is within `R e` of a common shift `m`
(`|(z'_j − z_j) − m| ≤ R e`, with `e` the error of the normalized residual and `R` a bound of
the unembedding's row norms), then `TV(softmax z, softmax z') ≤ tanh (R e/2)`. -/
theorem next_token_tv_le {β : Type} (E : ExpLaws α) (z z' : β → α) (L : List β) (hL : L ≠ [])
    {m R e : α} (h : ∀ j ∈ L, absA ((z' j - z j) - m) ≤ R * e) :
    tv (softmax E z L) (softmax E z' L) L ≤ tanhE E (R * e / 2) :=
  softmax_tv_le_tanh_shift E z z' L hL h

/-! ### The gated MLP -/

/-- A coordinate multiplier bounded by `B` scales the squared norm by at most `B²`:
`|u_j| ≤ B` for every `j` gives `Σ_j (u_j w_j)² ≤ B² Σ_j w_j²`. -/
theorem hadamard_sq_le {γ : Type} (u w : γ → α) (J : List γ) {B : α}
    (h : ∀ j ∈ J, absA (u j) ≤ B) :
    lsum (fun j => (u j * w j) * (u j * w j)) J ≤ B * B * lsum (fun j => w j * w j) J := by
  rw [← lsum_mul_left]
  apply lsum_le
  intro j hj
  have h1 := mul_self_le_of_absA_le (h j hj)
  have h2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right h1 (mul_self_nonneg (w j))
  grind

/-- A coordinatewise `L`-Lipschitz activation: `|φ(a_j) − φ(a'_j)| ≤ L |a_j − a'_j|` for every
`j` gives `Σ_j (φ(a_j) − φ(a'_j))² ≤ L² Σ_j (a_j − a'_j)²`. -/
theorem lipschitz_sq_le {γ : Type} (φ : α → α) (a a' : γ → α) (J : List γ) {L : α}
    (h : ∀ j ∈ J, absA (φ (a j) - φ (a' j)) ≤ L * absA (a j - a' j)) :
    lsum (fun j => (φ (a j) - φ (a' j)) * (φ (a j) - φ (a' j))) J ≤
      L * L * lsum (fun j => (a j - a' j) * (a j - a' j)) J := by
  rw [← lsum_mul_left]
  apply lsum_le
  intro j hj
  have h1 := mul_self_le_of_absA_le (h j hj)
  have h2 : absA (a j - a' j) * absA (a j - a' j) = (a j - a' j) * (a j - a' j) := by
    unfold absA; split <;> grind
  have e : L * absA (a j - a' j) * (L * absA (a j - a' j)) =
      L * L * (absA (a j - a' j) * absA (a j - a' j)) := by grind
  rw [h2] at e
  grind

/-- One coordinate's square is at most the sum of squares: `u_j² ≤ Σ_i u_i²` for `j ∈ J`. -/
theorem coord_sq_le_sum {γ : Type} (u : γ → α) (J : List γ) {j : γ} (hj : j ∈ J) :
    u j * u j ≤ lsum (fun i => u i * u i) J := by
  induction J with
  | nil => exact absurd hj (by simp)
  | cons i is ih =>
    simp only [lsum]
    have hi := mul_self_nonneg (u i)
    rcases List.mem_cons.mp hj with h | h
    · rw [h]
      have := lsum_nonneg (f := fun i => u i * u i) (L := is) (fun t _ => mul_self_nonneg (u t))
      grind
    · have := ih h
      grind

/-- The gated-MLP (SwiGLU) step. With `p = φ(a) ⊙ b` and `p' = φ(a') ⊙ b'` for a bilinear
product `⊙` (its difference splits as `(φ(a) − φ(a')) ⊙ b + φ(a') ⊙ (b − b')`), if
`‖(φ(a) − φ(a')) ⊙ b‖ ≤ B ‖φ(a) − φ(a')‖` (`B ≥ 0`), `‖φ(a') ⊙ (b − b')‖ ≤ P' ‖b − b'‖`,
`‖φ(a) − φ(a')‖ ≤ L_φ ‖a − a'‖` and `P' ≤ P + L_φ ‖a − a'‖`, then
`‖p − p'‖ ≤ L_φ B ‖a − a'‖ + (P + L_φ ‖a − a'‖) ‖b − b'‖`. -/
theorem glu_step_le {V : Type} (N : NormedLaws α V) (had : V → V → V) (φ : V → V)
    (a a' b b' : V) {B P P' Lφ : α} (hB0 : 0 ≤ B)
    (hdec : N.sub (had (φ a) b) (had (φ a') b') =
      N.add (had (N.sub (φ a) (φ a')) b) (had (φ a') (N.sub b b')))
    (hB : N.norm (had (N.sub (φ a) (φ a')) b) ≤ B * N.norm (N.sub (φ a) (φ a')))
    (hP : N.norm (had (φ a') (N.sub b b')) ≤ P' * N.norm (N.sub b b'))
    (hφ : N.norm (N.sub (φ a) (φ a')) ≤ Lφ * N.norm (N.sub a a'))
    (hPP : P' ≤ P + Lφ * N.norm (N.sub a a')) :
    N.norm (N.sub (had (φ a) b) (had (φ a') b')) ≤
      Lφ * B * N.norm (N.sub a a') + (P + Lφ * N.norm (N.sub a a')) * N.norm (N.sub b b') := by
  rw [hdec]
  have h1 := N.norm_add_le (had (N.sub (φ a) (φ a')) b) (had (φ a') (N.sub b b'))
  have h2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hφ hB0
  have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right hPP (N.norm_nonneg (N.sub b b'))
  grind

end WitCert.Depth

end
