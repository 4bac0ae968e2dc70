/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Semantic
public import WitCert.Sharp
public import WitCert.Output

/-!
# Semantic contracts of the remaining bridges, and their soundness statements

`WitCert.Semantic` turns a few bridges into semantic contracts. This file adds the others (the
sharp `tanh` softmax bridges, the selector-mass bridge, the storage witness with slope `1`, the
`ℓ²` pooling caliber, the decompression bridge and the attention-output error contract), and
states, for every bridge contract of both files, its soundness with the bound written out: the
exact and the approximate maps of the contract, its failure event, and the explicit transfer.
Each statement is proved from the contract's `sound` field.

## Main definitions

* Spaces: `normSpace` (a normed space `N : WitCert.Output.NormedLaws α V`, error `‖x − x'‖`, at
  any metric), `oscSpace` (logits with the oscillation error `max Δ − min Δ`), `selectorSpace`
  (selector weights with the total variation error), `distSpace` (probability vectors with the
  total variation error); over `Rat`: `sqVecSpace`, `sqSpace` (squared errors at any metric),
  `perTokenL2Space`, `pooledSqSpace`, `latentSpace`, `perTokenSqSpace`.
* `WitCert.Semantic.lmax`, `WitCert.Semantic.lmin`: the maximum and the minimum of `f t` over a
  nonempty list of coordinates (not clamped at `0`, unlike `lsup`); `lmaxFrom` is the fold.
* Bridges over an ordered field: `storageTriangle` (the storage witness, `a = 1`, `b = w`),
  `softmaxTVTanh` (`TV ≤ tanh (ε/2)`), `softmaxTVTanhOsc` (`TV ≤ tanh (osc/4)`),
  `selectorMassEform` (selector mass, `½ (exp (2ε) − 1)`), `outputError` (attention output,
  `‖y − ŷ‖ ≤ 2 M TV + R`).
* Bridges over `Rat`: `poolingL2Bridge` (`(y − y')² ≤ ‖w‖² Σ (v − v')²`),
  `cauchySchwarzBridge` (`(sc ⟨r, x⟩ − sc ⟨r, x'⟩)² ≤ sc² ‖r‖² ‖x − x'‖²` at any two metrics)
  and its instance `decompressionBridge` (latent residual to per-token max).

## Main statements

* `WitCert.Semantic.ratio_mono`, `tanhE_mono`, `tanh_half_mono`, `tanh_quarter_mono`: `tanh`
  and the transfers `ε ↦ tanh (ε/2)`, `osc ↦ tanh (osc/4)` are monotone.
* `WitCert.Semantic.le_lmaxFrom_start`, `le_lmaxFrom`, `le_lmax`, `lmin_le`: the extremes bound
  every coordinate.
* `WitCert.Semantic.sub_split`, `norm_sub_le`: `x − z = (x − y) + (y − z)` and the triangle
  inequality `‖x − z‖ ≤ ‖x − y‖ + ‖y − z‖` from the laws of `WitCert.Output.NormedLaws`.
* `WitCert.Semantic.lsum_mul_le`: a distribution's average of values at most `R` is at most
  `R`.
* Soundness of the contracts, bounds written out: `witness_contract_sound`,
  `softmax_tv_tanh_contract_sound`, `softmax_tv_tanh_osc_contract_sound`,
  `selector_mass_eform_contract_sound`, `softmax_tv_eform_contract_sound`,
  `softmax_tv_affine_contract_sound`, `output_error_contract_sound`,
  `output_error_contract_at` (the per-read offset `Σ_t q_t ρ_t`, no domain),
  `pooling_l2_contract_sound`, `pooling_max_contract_sound`, `score_bridge_contract_sound`,
  `rank_prefix_selection_contract_sound`, `decompression_contract_sound`.
* Glue lemmas in the form of soundness fields: `softmax_tv_tanh_glue`, `witness_triangle_glue`,
  `output_error_glue`, `pooling_l2_glue`.

## Implementation notes

* Every contract here is deterministic (`bad := fun _ => false`, `delta := 0`) and certified;
  the statements keep the hypothesis `bad ω = false` so they read as the soundness field.
* The oscillation `max_t Δ_t − min_t Δ_t` of the shifts `Δ_t = z'_t − z_t` uses the unclamped
  extremes `lmax`, `lmin` (`lmin f = −lmax (−f)`); on an empty list both are `0`.
* Over `Rat` the errors of the `ℓ²` bridges are squared (no square root over `Rat`), as for
  `WitCert.Semantic.scoreBridge`; the per-token `ℓ²` error is `keyErr`.
* The output-error contract reads probability vectors (nonnegative, summing to `1` on `L`): its
  offset `R` bounds the per-read offset `Σ_t q_t ρ_t` because `q` is a distribution.
* Definitions are `noncomputable`: they are evaluated by the kernel, never run.
-/

@[expose] public section

namespace WitCert.Semantic

section Field

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-! ### Monotone `tanh` and the sharp softmax bridges -/

/-- The map `x ↦ (x − 1)/(x + 1)` is monotone on the positive elements. -/
theorem ratio_mono {A B : α} (hA : 0 < A) (hAB : A ≤ B) :
    (A - 1) / (A + 1) ≤ (B - 1) / (B + 1) := by
  have hu := Analytic.inv_pos_of_pos (show 0 < A + 1 by grind)
  have hv := Analytic.inv_pos_of_pos (show 0 < B + 1 by grind)
  have e1 : (A + 1) * (A + 1)⁻¹ = 1 := by grind
  have e2 : (B + 1) * (B + 1)⁻¹ = 1 := by grind
  have h := Lean.Grind.OrderedRing.mul_nonneg
    (Lean.Grind.OrderedRing.mul_nonneg (Std.le_of_lt hu) (Std.le_of_lt hv))
    (show 0 ≤ B - A by grind)
  have e3 : (A + 1)⁻¹ * (B + 1)⁻¹ * (B - A) = (A + 1)⁻¹ - (B + 1)⁻¹ := by
    have : (A + 1)⁻¹ * (B + 1)⁻¹ * (B - A) =
        (A + 1)⁻¹ * ((B + 1) * (B + 1)⁻¹) - (B + 1)⁻¹ * ((A + 1) * (A + 1)⁻¹) := by grind
    rw [this, e1, e2]
    grind
  have e4 : (A - 1) / (A + 1) = 1 - 2 * (A + 1)⁻¹ := by
    have : (A - 1) / (A + 1) = (A + 1) * (A + 1)⁻¹ - 2 * (A + 1)⁻¹ := by grind
    rw [this, e1]
  have e5 : (B - 1) / (B + 1) = 1 - 2 * (B + 1)⁻¹ := by
    have : (B - 1) / (B + 1) = (B + 1) * (B + 1)⁻¹ - 2 * (B + 1)⁻¹ := by grind
    rw [this, e2]
  rw [e4, e5]
  grind

/-- `tanh y = (exp (2y) − 1)/(exp (2y) + 1)` is monotone. -/
theorem tanhE_mono (E : Analytic.ExpLaws α) {y y' : α} (h : y ≤ y') :
    Analytic.tanhE E y ≤ Analytic.tanhE E y' :=
  ratio_mono (E.exp_pos (2 * y)) (Analytic.ExpLaws.exp_le_exp E (show 2 * y ≤ 2 * y' by grind))

/-- The transfer `ε ↦ tanh (ε/2)` is monotone. -/
theorem tanh_half_mono (E : Analytic.ExpLaws α) {e e' : α} (h : e ≤ e') :
    Analytic.tanhE E (e / 2) ≤ Analytic.tanhE E (e' / 2) :=
  tanhE_mono E (by grind)

/-- The transfer `osc ↦ tanh (osc/4)` is monotone. -/
theorem tanh_quarter_mono (E : Analytic.ExpLaws α) {e e' : α} (h : e ≤ e') :
    Analytic.tanhE E (e / 4) ≤ Analytic.tanhE E (e' / 4) :=
  tanhE_mono E (by grind)

/-- The sharp bridge in the sup-norm form: if every logit moves by at most `ε`, then
`TV ≤ tanh (ε/2)`. From `WitCert.Analytic.softmax_tv_tanh_sound` with `m = −ε`, `M = ε`. -/
theorem softmax_tv_tanh_glue {β : Type} (E : Analytic.ExpLaws α) (z z' : β → α) (L : List β)
    (hL : L ≠ []) (ε : α) (hε : ∀ t ∈ L, Analytic.absA (z t - z' t) ≤ ε) :
    Analytic.tv (Analytic.softmax E z L) (Analytic.softmax E z' L) L ≤
      Analytic.tanhE E (ε / 2) := by
  have h := Analytic.softmax_tv_tanh_sound E z z' L hL (m := -ε) (M := ε)
    (fun t ht => by have := Analytic.le_of_absA_le (hε t ht); grind)
    (fun t ht => by have := Analytic.le_of_absA_le (hε t ht); grind)
  have e : (ε - -ε) / 4 = ε / 2 := by grind
  rw [e] at h
  exact h

/-- The sharp softmax-to-TV bridge, sup-norm form, as a monotone-transfer contract: the exact
and the approximate maps are softmax, the transfer is `ε ↦ tanh (ε/2)` (Python
`softmax_tv_tanh`). -/
noncomputable def softmaxTVTanh {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (S : Sample Ω) (s : Site) :
    MonoContract S (logitSpace (α := α) L s) (tvSpace L s) where
  exact z := Analytic.softmax E z L
  approx _ z' := Analytic.softmax E z' L
  transfer e := Analytic.tanhE E (e / 2)
  mono h := tanh_half_mono E h
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ z z' _ := softmax_tv_tanh_glue E z z' L hL
    (lsup (fun t => Analytic.absA (z t - z' t)) L)
    (fun t ht => le_lsup (fun t => Analytic.absA (z t - z' t)) L t ht)

/-- Soundness of `softmaxTVTanh`, bound written out: outside the failure event,
`TV(softmax z, softmax z') ≤ tanh (max_t |z_t − z'_t| / 2)`. -/
theorem softmax_tv_tanh_contract_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α)
    (L : List β) (hL : L ≠ []) (S : Sample Ω) (s : Site) (ω : Ω)
    (hω : (softmaxTVTanh E L hL S s).bad ω = false) (z z' : β → α) :
    Analytic.tv ((softmaxTVTanh E L hL S s).exact z) ((softmaxTVTanh E L hL S s).approx ω z') L ≤
      Analytic.tanhE E (lsup (fun t => Analytic.absA (z t - z' t)) L / 2) :=
  (softmaxTVTanh E L hL S s).sound ω hω z z' trivial

/-! ### Unclamped extremes and the oscillation bridge -/

/-- The maximum of `a` and the `f t` for the coordinates `t` of the list. -/
noncomputable def lmaxFrom {β : Type} (f : β → α) (a : α) : List β → α
  | [] => a
  | x :: xs => maxA (f x) (lmaxFrom f a xs)

/-- The start value is at most the fold. -/
theorem le_lmaxFrom_start {β : Type} (f : β → α) (a : α) (L : List β) : a ≤ lmaxFrom f a L := by
  induction L with
  | nil => simp only [lmaxFrom]; grind
  | cons x L ih =>
    simp only [lmaxFrom]
    have := le_maxA_right (f x) (lmaxFrom f a L)
    grind

/-- Every `f t` of the list is at most the fold. -/
theorem le_lmaxFrom {β : Type} (f : β → α) (a : α) (L : List β) :
    ∀ t ∈ L, f t ≤ lmaxFrom f a L := by
  induction L with
  | nil => intro t ht; cases ht
  | cons x L ih =>
    intro t ht
    have h₁ := le_maxA_left (f x) (lmaxFrom f a L)
    have h₂ := le_maxA_right (f x) (lmaxFrom f a L)
    simp only [lmaxFrom]
    rcases List.mem_cons.mp ht with rfl | ht
    · exact h₁
    · have := ih t ht
      grind

/-- The maximum of `f t` over the coordinates of a nonempty list, not clamped at `0` (`0` on the
empty list). -/
noncomputable def lmax {β : Type} (f : β → α) : List β → α
  | [] => 0
  | x :: xs => lmaxFrom f (f x) xs

/-- The minimum of `f t` over the coordinates of a nonempty list, not clamped at `0`:
`−lmax (−f)`. -/
noncomputable def lmin {β : Type} (f : β → α) (L : List β) : α := -lmax (fun t => -f t) L

/-- Every `f t` is at most the maximum. -/
theorem le_lmax {β : Type} (f : β → α) (L : List β) : ∀ t ∈ L, f t ≤ lmax f L := by
  cases L with
  | nil => intro t ht; cases ht
  | cons x L =>
    intro t ht
    simp only [lmax]
    rcases List.mem_cons.mp ht with rfl | ht
    · exact le_lmaxFrom_start f (f t) L
    · exact le_lmaxFrom f (f x) L t ht

/-- Every `f t` is at least the minimum. -/
theorem lmin_le {β : Type} (f : β → α) (L : List β) : ∀ t ∈ L, lmin f L ≤ f t := by
  intro t ht
  have := le_lmax (fun t => -f t) L t ht
  unfold lmin
  grind

/-- Logits on the coordinates `L`, with the oscillation error `max_t Δ_t − min_t Δ_t` of the
shifts `Δ_t = z'_t − z_t`. -/
noncomputable def oscSpace {β : Type} (L : List β) (s : Site) : Space α (.logitOsc s) where
  carrier := β → α
  err z z' := lmax (fun t => z' t - z t) L - lmin (fun t => z' t - z t) L

/-- The sharp softmax-to-TV bridge, oscillation form, as a monotone-transfer contract: the
transfer is `osc ↦ tanh (osc/4)` (Python `softmax_tv_tanh_osc`); the soundness field is
`WitCert.Analytic.softmax_tv_tanh_sound` with `m = min Δ`, `M = max Δ`. -/
noncomputable def softmaxTVTanhOsc {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (S : Sample Ω) (s : Site) :
    MonoContract S (oscSpace (α := α) L s) (tvSpace L s) where
  exact z := Analytic.softmax E z L
  approx _ z' := Analytic.softmax E z' L
  transfer e := Analytic.tanhE E (e / 4)
  mono h := tanh_quarter_mono E h
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ z z' _ := Analytic.softmax_tv_tanh_sound E z z' L hL
    (lmin_le (fun t => z' t - z t) L) (le_lmax (fun t => z' t - z t) L)

/-- Soundness of `softmaxTVTanhOsc`, bound written out: outside the failure event,
`TV(softmax z, softmax z') ≤ tanh ((max_t Δ_t − min_t Δ_t)/4)` with `Δ_t = z'_t − z_t`. -/
theorem softmax_tv_tanh_osc_contract_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α)
    (L : List β) (hL : L ≠ []) (S : Sample Ω) (s : Site) (ω : Ω)
    (hω : (softmaxTVTanhOsc E L hL S s).bad ω = false) (z z' : β → α) :
    Analytic.tv ((softmaxTVTanhOsc E L hL S s).exact z)
        ((softmaxTVTanhOsc E L hL S s).approx ω z') L ≤
      Analytic.tanhE E ((lmax (fun t => z' t - z t) L - lmin (fun t => z' t - z t) L) / 4) :=
  (softmaxTVTanhOsc E L hL S s).sound ω hω z z' trivial

/-! ### The e-form bridges: selector mass, and the contracts of `WitCert.Semantic` -/

/-- Selector weights on the coordinates `L` (the softmax of the selector's own scores), with
the total variation error. -/
noncomputable def selectorSpace {β : Type} (L : List β) (s : Site) :
    Space α (.selectorMass s) where
  carrier := β → α
  err p q := Analytic.tv p q L

/-- The selector-mass bridge as a monotone-transfer contract: from the selector's scores (sup
norm) to its softmax weights (total variation), transfer `ε ↦ ½ (exp (2ε) − 1)`; the soundness
field is `WitCert.Analytic.softmax_tv_eform_sound`. -/
noncomputable def selectorMassEform {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (S : Sample Ω) (s : Site) :
    MonoContract S (logitSpace (α := α) L s) (selectorSpace L s) where
  exact z := Analytic.softmax E z L
  approx _ z' := Analytic.softmax E z' L
  transfer e := (1 / 2) * (E.exp (2 * e) - 1)
  mono h := eform_mono E h
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ z z' _ := Analytic.softmax_tv_eform_sound E z z' L hL
    (lsup (fun t => Analytic.absA (z t - z' t)) L)
    (fun t ht => le_lsup (fun t => Analytic.absA (z t - z' t)) L t ht)

/-- Soundness of `selectorMassEform`, bound written out: outside the failure event, the
selector weights move by `TV ≤ ½ (exp (2 max_t |z_t − z'_t|) − 1)`. -/
theorem selector_mass_eform_contract_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α)
    (L : List β) (hL : L ≠ []) (S : Sample Ω) (s : Site) (ω : Ω)
    (hω : (selectorMassEform E L hL S s).bad ω = false) (z z' : β → α) :
    Analytic.tv ((selectorMassEform E L hL S s).exact z)
        ((selectorMassEform E L hL S s).approx ω z') L ≤
      1 / 2 * (E.exp (2 * lsup (fun t => Analytic.absA (z t - z' t)) L) - 1) :=
  (selectorMassEform E L hL S s).sound ω hω z z' trivial

/-- Soundness of `WitCert.Semantic.softmaxTVEform`, bound written out: outside the failure
event, `TV(softmax z, softmax z') ≤ ½ (exp (2 max_t |z_t − z'_t|) − 1)`. -/
theorem softmax_tv_eform_contract_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α)
    (L : List β) (hL : L ≠ []) (S : Sample Ω) (s : Site) (ω : Ω)
    (hω : (softmaxTVEform E L hL S s).bad ω = false) (z z' : β → α) :
    Analytic.tv ((softmaxTVEform E L hL S s).exact z) ((softmaxTVEform E L hL S s).approx ω z')
        L ≤
      1 / 2 * (E.exp (2 * lsup (fun t => Analytic.absA (z t - z' t)) L) - 1) :=
  (softmaxTVEform E L hL S s).sound ω hω z z' trivial

/-- Soundness of `WitCert.Semantic.softmaxTVAffine`, bound written out: outside the failure
event, on the domain `max_t |z_t − z'_t| ≤ ε₀`,
`TV(softmax z, softmax z') ≤ exp (2ε₀) · max_t |z_t − z'_t| + 0`. -/
theorem softmax_tv_affine_contract_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α)
    (L : List β) (hL : L ≠ []) (ε₀ : α) (S : Sample Ω) (s : Site) (ω : Ω)
    (hω : (softmaxTVAffine E L hL ε₀ S s).bad ω = false) (z z' : β → α)
    (hd : lsup (fun t => Analytic.absA (z t - z' t)) L ≤ ε₀) :
    Analytic.tv ((softmaxTVAffine E L hL ε₀ S s).exact z)
        ((softmaxTVAffine E L hL ε₀ S s).approx ω z') L ≤
      E.exp (2 * ε₀) * lsup (fun t => Analytic.absA (z t - z' t)) L + 0 :=
  (softmaxTVAffine E L hL ε₀ S s).sound ω hω z z' hd

/-! ### Normed spaces: the storage witness with slope `1` -/

/-- Points of a normed space `N` with the error `‖x − x'‖`, at any metric `m`. -/
noncomputable def normSpace {V : Type} (N : Output.NormedLaws α V) {s : Site} (m : Metric s) :
    Space α m where
  carrier := V
  err x x' := N.norm (N.sub x x')

/-- `x − z = (x − y) + (y − z)`. -/
theorem sub_split {V : Type} (N : Output.NormedLaws α V) (x y z : V) :
    N.sub x z = N.add (N.sub x y) (N.sub y z) := by
  rw [N.sub_eq_add_neg x z, N.sub_eq_add_neg x y, N.sub_eq_add_neg y z,
    N.add_assoc x (N.neg y) (N.add y (N.neg z)), ← N.add_assoc (N.neg y) y (N.neg z),
    N.neg_add_cancel, N.zero_add]

/-- The triangle inequality `‖x − z‖ ≤ ‖x − y‖ + ‖y − z‖`. -/
theorem norm_sub_le {V : Type} (N : Output.NormedLaws α V) (x y z : V) :
    N.norm (N.sub x z) ≤ N.norm (N.sub x y) + N.norm (N.sub y z) := by
  rw [sub_split N x y z]
  exact N.norm_add_le _ _

/-- The storage witness with slope `1` in the form of a soundness field: if every point is
stored within `w`, then `‖k − store k'‖ ≤ 1 · ‖k − k'‖ + w` (triangle inequality). -/
theorem witness_triangle_glue {V : Type} (N : Output.NormedLaws α V) (store : V → V) {w : α}
    (hw : ∀ k, N.norm (N.sub k (store k)) ≤ w) (k k' : V) :
    N.norm (N.sub k (store k')) ≤ 1 * N.norm (N.sub k k') + w := by
  have h₁ := norm_sub_le N k k' (store k')
  have h₂ := hw k'
  grind

/-- The storage witness as a contract with slope `1` on a normed space (Python
`witness_contract` with the triangle bound, `a = 1`, `b = w`): the exact map keeps the point,
the approximate map stores it; every input is in the domain. -/
noncomputable def storageTriangle {Ω : Type} {V : Type} (N : Output.NormedLaws α V) {s : Site}
    (m : Metric s) (store : V → V) (w : α) (hw : ∀ k, N.norm (N.sub k (store k)) ≤ w)
    (S : Sample Ω) : Contract S (normSpace N m) (normSpace N m) where
  exact k := k
  approx _ k' := store k'
  a := 1
  b := w
  a_nonneg := by grind
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ k k' _ := witness_triangle_glue N store hw k k'

/-- Soundness of `storageTriangle`, bound written out: outside the failure event,
`‖k − store k'‖ ≤ 1 · ‖k − k'‖ + w`. -/
theorem witness_contract_sound {Ω : Type} {V : Type} (N : Output.NormedLaws α V) {s : Site}
    (m : Metric s) (store : V → V) (w : α) (hw : ∀ k, N.norm (N.sub k (store k)) ≤ w)
    (S : Sample Ω) (ω : Ω) (hω : (storageTriangle N m store w hw S).bad ω = false) (k k' : V) :
    N.norm (N.sub ((storageTriangle N m store w hw S).exact k)
        ((storageTriangle N m store w hw S).approx ω k')) ≤ 1 * N.norm (N.sub k k') + w :=
  (storageTriangle N m store w hw S).sound ω hω k k' trivial

/-! ### The attention-output error contract -/

/-- Probability vectors on the coordinates `L` (nonnegative, summing to `1`), with the total
variation error. -/
noncomputable def distSpace {β : Type} (L : List β) (s : Site) : Space α (.attentionTV s) where
  carrier := {p : β → α // (∀ t ∈ L, 0 ≤ p t) ∧ Analytic.lsum p L = 1}
  err p q := Analytic.tv p.1 q.1 L

/-- A distribution's average of values at most `R` is at most `R`: `Σ_t q_t ρ_t ≤ R`. -/
theorem lsum_mul_le {β : Type} (q ρ : β → α) (L : List β) {R : α} (hq : ∀ t ∈ L, 0 ≤ q t)
    (hs : Analytic.lsum q L = 1) (hR : ∀ t ∈ L, ρ t ≤ R) :
    Analytic.lsum (fun t => q t * ρ t) L ≤ R := by
  have h : Analytic.lsum (fun t => q t * ρ t) L ≤ Analytic.lsum (fun t => R * q t) L :=
    Analytic.lsum_le (fun t ht => by
      have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (hR t ht) (hq t ht)
      grind)
  rw [Analytic.lsum_mul_left, hs] at h
  grind

/-- The output bound in the form of a soundness field: with `‖v_t‖ ≤ M`, `‖v_t − w_t‖ ≤ ρ_t ≤ R`
and two distributions `p`, `q`, `‖Σ p_t v_t − Σ q_t w_t‖ ≤ 2 M · TV(p, q) + R`. From
`WitCert.Meters.output_error_bound_vector_sound`. -/
theorem output_error_glue {V β : Type} (N : Output.NormedLaws α V) (v w : β → V) (ρ : β → α)
    (L : List β) (M R : α) (hv : ∀ t ∈ L, N.norm (v t) ≤ M)
    (hρ : ∀ t ∈ L, N.norm (N.sub (v t) (w t)) ≤ ρ t) (hR : ∀ t ∈ L, ρ t ≤ R)
    (p q : {p : β → α // (∀ t ∈ L, 0 ≤ p t) ∧ Analytic.lsum p L = 1}) :
    N.norm (N.sub (N.vsum (fun t => N.smul (p.1 t) (v t)) L)
        (N.vsum (fun t => N.smul (q.1 t) (w t)) L)) ≤
      2 * M * Analytic.tv p.1 q.1 L + R := by
  have h := Meters.output_error_bound_vector_sound N p.1 q.1 v w ρ L M hv hρ q.2.1
  have h' := lsum_mul_le q.1 ρ L q.2.1 q.2.2 hR
  grind

/-- The attention-output error as a contract (Python `meters.output_error_bound`, `a = 2M`,
`b = R`): from the attention weights (distributions, total variation) to the attention output
`Σ_t p_t v_t` in the normed space `N`; the approximate output reads the reconstructed values
`w_t`, each within `ρ_t ≤ R` of `v_t`. -/
noncomputable def outputError {Ω : Type} {V β : Type} (N : Output.NormedLaws α V) (v w : β → V)
    (ρ : β → α) (L : List β) (M R : α) (hM : 0 ≤ M) (hv : ∀ t ∈ L, N.norm (v t) ≤ M)
    (hρ : ∀ t ∈ L, N.norm (N.sub (v t) (w t)) ≤ ρ t) (hR : ∀ t ∈ L, ρ t ≤ R) (S : Sample Ω)
    (s : Site) : Contract S (distSpace (α := α) L s) (normSpace N (.attentionOutputL2 s)) where
  exact p := N.vsum (fun t => N.smul (p.1 t) (v t)) L
  approx _ q := N.vsum (fun t => N.smul (q.1 t) (w t)) L
  a := 2 * M
  b := R
  a_nonneg := by grind
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ p q _ := output_error_glue N v w ρ L M R hv hρ hR p q

/-- Soundness of `outputError`, bound written out: outside the failure event,
`‖y − ŷ‖ ≤ 2 M · TV(p, q) + R`. -/
theorem output_error_contract_sound {Ω : Type} {V β : Type} (N : Output.NormedLaws α V)
    (v w : β → V) (ρ : β → α) (L : List β) (M R : α) (hM : 0 ≤ M)
    (hv : ∀ t ∈ L, N.norm (v t) ≤ M) (hρ : ∀ t ∈ L, N.norm (N.sub (v t) (w t)) ≤ ρ t)
    (hR : ∀ t ∈ L, ρ t ≤ R) (S : Sample Ω) (s : Site) (ω : Ω)
    (hω : (outputError N v w ρ L M R hM hv hρ hR S s).bad ω = false)
    (p q : {p : β → α // (∀ t ∈ L, 0 ≤ p t) ∧ Analytic.lsum p L = 1}) :
    N.norm (N.sub ((outputError N v w ρ L M R hM hv hρ hR S s).exact p)
        ((outputError N v w ρ L M R hM hv hρ hR S s).approx ω q)) ≤
      2 * M * Analytic.tv p.1 q.1 L + R :=
  (outputError N v w ρ L M R hM hv hρ hR S s).sound ω hω p q trivial

/-- The output-error contract at one read, with the per-read offset: at every sample point and
for all distributions `p`, `q`, `‖y − ŷ‖ ≤ a · TV(p, q) + Σ_t q_t ρ_t` (at most the offset `R`
of the contract). From `WitCert.Meters.output_error_bound_vector_sound`. -/
theorem output_error_contract_at {Ω : Type} {V β : Type} (N : Output.NormedLaws α V)
    (v w : β → V) (ρ : β → α) (L : List β) (M R : α) (hM : 0 ≤ M)
    (hv : ∀ t ∈ L, N.norm (v t) ≤ M) (hρ : ∀ t ∈ L, N.norm (N.sub (v t) (w t)) ≤ ρ t)
    (hR : ∀ t ∈ L, ρ t ≤ R) (S : Sample Ω) (s : Site) (ω : Ω)
    (p q : {p : β → α // (∀ t ∈ L, 0 ≤ p t) ∧ Analytic.lsum p L = 1}) :
    N.norm (N.sub ((outputError N v w ρ L M R hM hv hρ hR S s).exact p)
        ((outputError N v w ρ L M R hM hv hρ hR S s).approx ω q)) ≤
      (outputError N v w ρ L M R hM hv hρ hR S s).a * Analytic.tv p.1 q.1 L +
        Analytic.lsum (fun t => q.1 t * ρ t) L := by
  have h := Meters.output_error_bound_vector_sound N p.1 q.1 v w ρ L M hv hρ q.2.1
  have ha : (outputError N v w ρ L M R hM hv hρ hR S s).a = 2 * M := rfl
  rw [ha]
  show N.norm (N.sub (N.vsum (fun t => N.smul (p.1 t) (v t)) L)
      (N.vsum (fun t => N.smul (q.1 t) (w t)) L)) ≤
    2 * M * Analytic.tv p.1 q.1 L + Analytic.lsum (fun t => q.1 t * ρ t) L
  grind

end Field

/-! ### Bridges over `Rat`: `ℓ²` pooling, Cauchy–Schwarz, decompression -/

section RatBridges

variable {Ω : Type} {β : Type}

/-- Vectors on the coordinates `L` with the squared Euclidean error `Σ_t (x_t − x'_t)²`
(`keyErr`), at any metric `m`. -/
noncomputable def sqVecSpace (L : List β) {s : Site} (m : Metric s) : Space Rat m where
  carrier := β → Rat
  err x x' := keyErr L x x'

/-- One rational with the squared error `(y − y')²`, at any metric `m`. -/
noncomputable def sqSpace {s : Site} (m : Metric s) : Space Rat m where
  carrier := Rat
  err y y' := (y - y') * (y - y')

/-- Per-token vectors on the coordinates `L` with the squared `ℓ²` error. -/
noncomputable def perTokenL2Space (L : List β) (s : Site) : Space Rat (.perTokenL2 s) :=
  sqVecSpace L (.perTokenL2 s)

/-- One pooled value with the squared error `(y − y')²`. -/
noncomputable def pooledSqSpace (s : Site) : Space Rat (.pooledError s) :=
  sqSpace (.pooledError s)

/-- Latent vectors on the coordinates `L` with the squared `ℓ²` error. -/
noncomputable def latentSpace (L : List β) (s : Site) : Space Rat (.latentResidual s) :=
  sqVecSpace L (.latentResidual s)

/-- One decompressed per-token value with the squared error `(y − y')²`. -/
noncomputable def perTokenSqSpace (s : Site) : Space Rat (.perTokenMax s) :=
  sqSpace (.perTokenMax s)

/-- The `ℓ²` pooling caliber in the form of a soundness field:
`(⟨w, v⟩ − ⟨w, v'⟩)² ≤ ‖w‖² Σ_t (v_t − v'_t)²`. From `WitCert.Bridges.pooling_l2_caliber`. -/
theorem pooling_l2_glue (L : List β) (w v v' : β → Rat) :
    (Bridges.dot (L.map fun t => (w t, v t)) - Bridges.dot (L.map fun t => (w t, v' t))) *
      (Bridges.dot (L.map fun t => (w t, v t)) - Bridges.dot (L.map fun t => (w t, v' t))) ≤
      (L.map fun t => w t * w t).sum * keyErr L v v' + 0 := by
  have h := Bridges.pooling_l2_caliber (L.map fun t => (w t, v t - v' t))
  rw [normSqFst_map L w (fun t => v t - v' t), normSqSnd_map L w (fun t => v t - v' t)] at h
  rw [dot_map_sub L w v v']
  unfold keyErr
  grind

/-- The pooling bridge, `ℓ²` caliber, as a contract from per-token vectors to one pooled value
(Python `pooling(...).l2`, squared: `a = ‖w‖²`, `b = 0`). -/
noncomputable def poolingL2Bridge (L : List β) (w : β → Rat) (S : Sample Ω) (s : Site) :
    Contract S (perTokenL2Space L s) (pooledSqSpace s) where
  exact v := Bridges.dot (L.map fun t => (w t, v t))
  approx _ v' := Bridges.dot (L.map fun t => (w t, v' t))
  a := (L.map fun t => w t * w t).sum
  b := 0
  a_nonneg := sum_nonneg L (fun t => w t * w t) (fun t _ => Bridges.mul_self_nonneg (w t))
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ v v' _ := pooling_l2_glue L w v v'

/-- Soundness of `poolingL2Bridge`, bound written out: outside the failure event,
`(y − y')² ≤ ‖w‖² Σ_t (v_t − v'_t)² + 0`. -/
theorem pooling_l2_contract_sound (L : List β) (w : β → Rat) (S : Sample Ω) (s : Site) (ω : Ω)
    (hω : (poolingL2Bridge L w S s).bad ω = false) (v v' : β → Rat) :
    (@HSub.hSub Rat Rat Rat _ ((poolingL2Bridge L w S s).exact v)
        ((poolingL2Bridge L w S s).approx ω v')) *
      (@HSub.hSub Rat Rat Rat _ ((poolingL2Bridge L w S s).exact v)
        ((poolingL2Bridge L w S s).approx ω v')) ≤
      (L.map fun t => w t * w t).sum * keyErr L v v' + 0 :=
  (poolingL2Bridge L w S s).sound ω hω v v' trivial

/-- Soundness of `WitCert.Semantic.poolingBridge` (max caliber), bound written out: outside the
failure event, `|y − y'| ≤ (Σ_t w_t) · max_t |v_t − v'_t| + 0`. -/
theorem pooling_max_contract_sound (L : List β) (w : β → Rat) (hw : ∀ t ∈ L, 0 ≤ w t)
    (S : Sample Ω) (s : Site) (ω : Ω) (hω : (poolingBridge L w hw S s).bad ω = false)
    (v v' : β → Rat) :
    Bridges.abs (@HSub.hSub Rat Rat Rat _ ((poolingBridge L w hw S s).exact v)
        ((poolingBridge L w hw S s).approx ω v')) ≤
      (L.map w).sum * lsup (fun t => Bridges.abs (v t - v' t)) L + 0 :=
  (poolingBridge L w hw S s).sound ω hω v v' trivial

/-- Soundness of `WitCert.Semantic.scoreBridge`, bound written out: outside the failure event,
`(z − z')² ≤ sc² ‖q‖² Σ_t (k_t − k'_t)² + 0`. -/
theorem score_bridge_contract_sound (L : List β) (q : β → Rat) (sc : Rat) (S : Sample Ω)
    (s : Site) (ω : Ω) (hω : (scoreBridge L q sc S s).bad ω = false) (k k' : β → Rat) :
    (@HSub.hSub Rat Rat Rat _ ((scoreBridge L q sc S s).exact k)
        ((scoreBridge L q sc S s).approx ω k')) *
      (@HSub.hSub Rat Rat Rat _ ((scoreBridge L q sc S s).exact k)
        ((scoreBridge L q sc S s).approx ω k')) ≤
      sc * sc * (L.map fun t => q t * q t).sum * keyErr L k k' + 0 :=
  (scoreBridge L q sc S s).sound ω hω k k' trivial

/-- Soundness of `WitCert.Semantic.selectionBridge`, bound written out: outside the failure
event, the total variation over all positions is at most `1 · TV` over the kept positions plus
`selectionOffset m_out m_in`. -/
theorem rank_prefix_selection_contract_sound {n : Nat} (dropped added : List Rat)
    {mOut mIn : Rat} (hd : ∀ x ∈ dropped, 0 ≤ x) (ha : ∀ x ∈ added, 0 ≤ x)
    (hOut : dropped.sum ≤ mOut) (hIn : added.sum ≤ mIn) (S : Sample Ω) (s : Site) (ω : Ω)
    (hω : (selectionBridge n dropped added hd ha hOut hIn S s).bad ω = false)
    (p p' : {l : List Rat // l.length = n}) :
    Bridges.tv (List.zip ((selectionBridge n dropped added hd ha hOut hIn S s).exact p).1
        ((selectionBridge n dropped added hd ha hOut hIn S s).approx ω p').1) ≤
      1 * Bridges.tv (List.zip p.1 p'.1) + Bridges.selectionOffset mOut mIn :=
  (selectionBridge n dropped added hd ha hOut hIn S s).sound ω hω p p' trivial

/-- The row-wise Cauchy–Schwarz bridge at any two metrics: the exact and the approximate outputs
are `sc ⟨r, x⟩` and `sc ⟨r, x'⟩`, and the squared errors obey `e_out ≤ (sc² ‖r‖²) e_in + 0`;
the soundness field is `WitCert.Semantic.score_glue`. -/
noncomputable def cauchySchwarzBridge (L : List β) (r : β → Rat) (sc : Rat) {s t : Site}
    (i : Metric s) (o : Metric t) (S : Sample Ω) : Contract S (sqVecSpace L i) (sqSpace o) where
  exact x := sc * Bridges.dot (L.map fun u => (r u, x u))
  approx _ x' := sc * Bridges.dot (L.map fun u => (r u, x' u))
  a := sc * sc * (L.map fun u => r u * r u).sum
  b := 0
  a_nonneg := Rat.mul_nonneg (Bridges.mul_self_nonneg sc)
    (sum_nonneg L (fun u => r u * r u) (fun u _ => Bridges.mul_self_nonneg (r u)))
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ x x' _ := score_glue L r x x' sc

/-- The decompression bridge (Python `decompression_bridge`, squared): from a latent vector
(squared `ℓ²` residual) to one decompressed per-token value `sc ⟨r, c⟩` (squared error), with
the row `r` of the up-projection; `a = sc² ‖r‖²`, `b = 0`. -/
noncomputable def decompressionBridge (L : List β) (r : β → Rat) (sc : Rat) (S : Sample Ω)
    (s : Site) : Contract S (latentSpace L s) (perTokenSqSpace s) :=
  cauchySchwarzBridge L r sc (.latentResidual s) (.perTokenMax s) S

/-- Soundness of `decompressionBridge`, bound written out: outside the failure event,
`(y − y')² ≤ sc² ‖r‖² Σ_t (c_t − c'_t)² + 0`. -/
theorem decompression_contract_sound (L : List β) (r : β → Rat) (sc : Rat) (S : Sample Ω)
    (s : Site) (ω : Ω) (hω : (decompressionBridge L r sc S s).bad ω = false) (c c' : β → Rat) :
    (@HSub.hSub Rat Rat Rat _ ((decompressionBridge L r sc S s).exact c)
        ((decompressionBridge L r sc S s).approx ω c')) *
      (@HSub.hSub Rat Rat Rat _ ((decompressionBridge L r sc S s).exact c)
        ((decompressionBridge L r sc S s).approx ω c')) ≤
      sc * sc * (L.map fun t => r t * r t).sum * keyErr L c c' + 0 :=
  (decompressionBridge L r sc S s).sound ω hω c c' trivial

end RatBridges

end WitCert.Semantic

end
