/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Semantic
public import WitCert.SemanticBridges
public import WitCert.Depth

/-!
# The depth steps as semantic contracts

The steps of `WitCert.Depth` restated about semantic contracts of `WitCert.Semantic`: a residual
connection as a monotone-transfer contract on the residual stream (metric `residualL2`), and the
next-token head as a contract from the residual stream to the next-token distribution (metric
`nextTokenTV`). The statements name the contract's exact and approximate maps and write the
bound out.

## Main definitions

* `WitCert.Semantic.nextTokenSpace`: next-token weights over a vocabulary list, with the total
  variation error, at the metric `nextTokenTV`.
* `WitCert.Semantic.residualStep`: the residual connection `x ↦ x + f x`, served as
  `x' ↦ x' + g x'`, with the transfer `e ↦ e + T e` for a monotone `T` bounding
  `‖f x − g x'‖` by `T ‖x − x'‖`.
* `WitCert.Semantic.outputProjection`: a linear map `f` with operator norm at most `L` (the
  attention output projection `W_O`) from the attention output (`attentionOutputL2`) into the
  residual stream (`residualL2`), with the transfer `e ↦ L e`.
* `WitCert.Semantic.nextTokenTanh`: the next-token head `x ↦ softmax (ℓ x)`, served as
  `x' ↦ softmax (ℓ' x')`, with the transfer `e ↦ tanh (R e/2)` when every vocabulary logit
  shift is within `R ‖x − x'‖` of a common shift.

## Main statements

* `WitCert.Semantic.residual_step_contract_sound`: `‖(x + f x) − (x' + g x')‖ ≤
  ‖x − x'‖ + T ‖x − x'‖`.
* `WitCert.Semantic.output_projection_contract_sound`: `‖f x − f x'‖ ≤ L ‖x − x'‖`.
* `WitCert.Semantic.next_token_contract_sound`: `TV(softmax (ℓ x), softmax (ℓ' x')) ≤
  tanh (R ‖x − x'‖/2)`.

## Implementation notes

The contracts are deterministic (`bad := fun _ => false`, `delta := 0`) and certified, on the
whole domain; the statements keep the hypothesis `bad ω = false` so they read as the soundness
field. The residual stream is a normed space `N : WitCert.Output.NormedLaws α V` with the error
`‖x − x'‖` (`WitCert.Semantic.normSpace` at `residualL2`). The head `ℓ` maps the residual to the
vocabulary logits (the final normalization included); its hypothesis is the shift form of
`WitCert.Depth.next_token_tv_le`.
-/

@[expose] public section

namespace WitCert.Semantic

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- Next-token weights on the vocabulary `L`, with the total variation error. -/
noncomputable def nextTokenSpace {β : Type} (L : List β) (s : Site) :
    Space α (.nextTokenTV s) where
  carrier := β → α
  err p q := Analytic.tv p q L

set_option linter.unusedSectionVars false in
/-- The transfer `e ↦ e + T e` of a residual connection is monotone when `T` is. -/
theorem add_transfer_mono {T : α → α} (hT : ∀ e e' : α, e ≤ e' → T e ≤ T e') {e e' : α}
    (h : e ≤ e') : e + T e ≤ e' + T e' := by
  have := hT e e' h
  grind

/-- A residual connection as a monotone-transfer contract on the residual stream: the exact map
is `x ↦ x + f x`, the approximate map `x' ↦ x' + g x'` (the served sublayer `g`, possibly
different from `f`), and the transfer `e ↦ e + T e` for a monotone `T` with
`‖f x − g x'‖ ≤ T ‖x − x'‖`; the soundness field is `WitCert.Depth.residual_step_le`. -/
noncomputable def residualStep {Ω V : Type} (N : Output.NormedLaws α V) (f g : V → V)
    (T : α → α) (hT : ∀ e e' : α, e ≤ e' → T e ≤ T e')
    (hfg : ∀ x x', N.norm (N.sub (f x) (g x')) ≤ T (N.norm (N.sub x x'))) (S : Sample Ω)
    (s : Site) : MonoContract S (normSpace N (.residualL2 s)) (normSpace N (.residualL2 s)) where
  exact x := N.add x (f x)
  approx _ x' := N.add x' (g x')
  transfer e := e + T e
  mono h := add_transfer_mono hT h
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ x x' _ := by
    have h := Depth.residual_step_le N f g x x'
    have h' := hfg x x'
    show N.norm (N.sub (N.add x (f x)) (N.add x' (g x'))) ≤
      N.norm (N.sub x x') + T (N.norm (N.sub x x'))
    grind

/-- Soundness of `residualStep`, bound written out: outside the failure event,
`‖(x + f x) − (x' + g x')‖ ≤ ‖x − x'‖ + T ‖x − x'‖`. -/
theorem residual_step_contract_sound {Ω V : Type} (N : Output.NormedLaws α V) (f g : V → V)
    (T : α → α) (hT : ∀ e e' : α, e ≤ e' → T e ≤ T e')
    (hfg : ∀ x x', N.norm (N.sub (f x) (g x')) ≤ T (N.norm (N.sub x x'))) (S : Sample Ω)
    (s : Site) (ω : Ω) (hω : (residualStep N f g T hT hfg S s).bad ω = false) (x x' : V) :
    N.norm (N.sub ((residualStep N f g T hT hfg S s).exact x)
        ((residualStep N f g T hT hfg S s).approx ω x')) ≤
      N.norm (N.sub x x') + T (N.norm (N.sub x x')) :=
  (residualStep N f g T hT hfg S s).sound ω hω x x' trivial

/-- A linear map `f` whose operator norm is at most `L` (`‖f u − f v‖ ≤ L ‖u − v‖`), such as
the attention output projection `W_O`, as a monotone-transfer contract from the attention
output (metric `attentionOutputL2`) into the residual stream (metric `residualL2`): the exact
and approximate maps are both `f`, the transfer `e ↦ L e`. -/
noncomputable def outputProjection {Ω V : Type} (N : Output.NormedLaws α V) (f : V → V) (L : α)
    (hL : 0 ≤ L) (hf : ∀ u v, N.norm (N.sub (f u) (f v)) ≤ L * N.norm (N.sub u v))
    (S : Sample Ω) (s : Site) :
    MonoContract S (normSpace N (.attentionOutputL2 s)) (normSpace N (.residualL2 s)) where
  exact x := f x
  approx _ x' := f x'
  transfer e := L * e
  mono h := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h hL
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ x x' _ := hf x x'

/-- Soundness of `outputProjection`, bound written out: outside the failure event,
`‖f x − f x'‖ ≤ L ‖x − x'‖`. -/
theorem output_projection_contract_sound {Ω V : Type} (N : Output.NormedLaws α V) (f : V → V)
    (L : α) (hL : 0 ≤ L) (hf : ∀ u v, N.norm (N.sub (f u) (f v)) ≤ L * N.norm (N.sub u v))
    (S : Sample Ω) (s : Site) (ω : Ω) (hω : (outputProjection N f L hL hf S s).bad ω = false)
    (x x' : V) :
    N.norm (N.sub ((outputProjection N f L hL hf S s).exact x)
        ((outputProjection N f L hL hf S s).approx ω x')) ≤ L * N.norm (N.sub x x') :=
  (outputProjection N f L hL hf S s).sound ω hω x x' trivial

/-- The transfer `e ↦ tanh (R e/2)` is monotone for `R ≥ 0`. -/
theorem tanh_scaled_half_mono (E : Analytic.ExpLaws α) {R e e' : α} (hR : 0 ≤ R)
    (h : e ≤ e') : Analytic.tanhE E (R * e / 2) ≤ Analytic.tanhE E (R * e' / 2) := by
  have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h hR
  exact tanhE_mono E (by grind)

/-- The next-token head as a monotone-transfer contract from the residual stream to the
next-token distribution over a nonempty vocabulary `L`: the exact map is `x ↦ softmax (ℓ x)`,
the approximate map `x' ↦ softmax (ℓ' x')`, and the transfer `e ↦ tanh (R e/2)`, when every
vocabulary logit shift is within `R ‖x − x'‖` of a common shift; the soundness field is
`WitCert.Depth.next_token_tv_le`. -/
noncomputable def nextTokenTanh {Ω V β : Type} (E : Analytic.ExpLaws α)
    (N : Output.NormedLaws α V) (L : List β) (hL : L ≠ []) (ℓ ℓ' : V → β → α) (R : α)
    (hR : 0 ≤ R)
    (hℓ : ∀ x x', ∃ m, ∀ j ∈ L, Analytic.absA ((ℓ' x' j - ℓ x j) - m) ≤
      R * N.norm (N.sub x x'))
    (S : Sample Ω) (s : Site) :
    MonoContract S (normSpace N (.residualL2 s)) (nextTokenSpace (α := α) L s) where
  exact x := Analytic.softmax E (ℓ x) L
  approx _ x' := Analytic.softmax E (ℓ' x') L
  transfer e := Analytic.tanhE E (R * e / 2)
  mono h := tanh_scaled_half_mono E hR h
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ x x' _ := by
    obtain ⟨m, hm⟩ := hℓ x x'
    exact Depth.next_token_tv_le E (ℓ x) (ℓ' x') L hL hm

/-- Soundness of `nextTokenTanh`, bound written out: outside the failure event,
`TV(softmax (ℓ x), softmax (ℓ' x')) ≤ tanh (R ‖x − x'‖/2)`. -/
theorem next_token_contract_sound {Ω V β : Type} (E : Analytic.ExpLaws α)
    (N : Output.NormedLaws α V) (L : List β) (hL : L ≠ []) (ℓ ℓ' : V → β → α) (R : α)
    (hR : 0 ≤ R)
    (hℓ : ∀ x x', ∃ m, ∀ j ∈ L, Analytic.absA ((ℓ' x' j - ℓ x j) - m) ≤
      R * N.norm (N.sub x x'))
    (S : Sample Ω) (s : Site) (ω : Ω) (hω : (nextTokenTanh E N L hL ℓ ℓ' R hR hℓ S s).bad ω = false)
    (x x' : V) :
    Analytic.tv ((nextTokenTanh E N L hL ℓ ℓ' R hR hℓ S s).exact x)
        ((nextTokenTanh E N L hL ℓ ℓ' R hR hℓ S s).approx ω x') L ≤
      Analytic.tanhE E (R * N.norm (N.sub x x') / 2) :=
  (nextTokenTanh E N L hL ℓ ℓ' R hR hℓ S s).sound ω hω x x' trivial

end WitCert.Semantic

end
