/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Semantic
public import WitCert.Eviction

/-!
# Token eviction as a semantic contract

The theorems of `WitCert.Eviction` restated about a semantic contract of `WitCert.Semantic`:
the statements name the contract's exact and approximate maps and write the eviction bound out.

## Main definitions

* `WitCert.Semantic.evictTV`: eviction as a monotone-transfer contract from logits to
  attention weights: the exact map is the softmax of the logits over all the tokens of `L`,
  the approximate map the softmax over the kept tokens alone (`0` at the dropped ones). Its
  transfer is the constant `1` (`WitCert.Eviction.tv_kept_le_one`), the saturation of the total
  variation: the bound of an eviction depends on the logits and the witnesses, not on the input
  error, and is stated by the meter theorems below.

## Main statements

* `WitCert.Semantic.evict_tv_meter_eq`: the output error of `evictTV` at exact logits `z` is
  the dropped mass, `TV = Z_D / (Z_K + Z_D)`.
* `WitCert.Semantic.evict_tv_meter_sound`: with witnesses `z_t ≤ u_t` of the dropped tokens,
  `TV ≤ U_D / (Z_K + U_D)`.
* `WitCert.Semantic.evict_tv_blocks_meter_sound`: with block witnesses `z_t ≤ u_{blk t}`,
  `TV ≤ U / (Z_K + U)`, `U = Σ_{b ∈ B} n_b exp u_b`.
* `WitCert.Semantic.evict_quant_meter_sound`: at exact logits `z` and logits `z'` computed from
  compressed kept keys, `TV ≤ Z_D / (Z_K + Z_D) + TV(softmax z (L kept), softmax z' (L kept))`;
  `WitCert.Semantic.evict_quant_blocks_meter_sound`: the same with `U / (Z_K + U)` for the
  first term.
* `WitCert.Semantic.evict_tv_restore_meter_le`: a cache that drops a subset of the tokens of a
  certified eviction (after a gate restored blocks) stays within that eviction's block bound.

## Implementation notes

`evictTV` is deterministic (its failure event is never hit), so the meter statements hold at
every sample point `ω`. The approximate map of `evictTV` takes its own logits `z'`: the meters
`evict_tv_*` state it at exact logits (`z' = z`, the kept keys' logits are those of the full
cache), the meters `evict_quant_*` at logits `z'` computed from compressed kept keys, where the
eviction bound and the compression error over the kept keys add by the triangle inequality of
the total variation (`WitCert.Eviction.tv_triangle`).
-/

@[expose] public section

namespace WitCert.Semantic

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- Eviction of the tokens `drop t = true` as a monotone-transfer contract from logits to
attention weights on the tokens of a nonempty list `L`: the exact map is `softmax z` over `L`,
the approximate map the softmax of `z'` over the kept tokens alone, `0` at the dropped ones.
The transfer is the constant `1`; the soundness field is `WitCert.Eviction.tv_kept_le_one`. -/
noncomputable def evictTV {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (drop : β → Bool) (S : Sample Ω) (s : Site) :
    MonoContract S (logitSpace (α := α) L s) (tvSpace L s) where
  exact z := Analytic.softmax E z L
  approx _ z' t := cond (drop t) 0 (Analytic.softmax E z' (L.filter (fun t => !drop t)) t)
  transfer _ := 1
  mono _ := by
    show (1 : α) ≤ 1
    grind
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ z z' _ := Eviction.tv_kept_le_one E z z' drop L hL

set_option linter.unusedSectionVars false in
/-- The eviction meter as a statement about `evictTV`, exact form: at every sample point, if
some token of `L` is kept, the output error of the contract at the logits `z` is the dropped
mass `TV = Z_D / (Z_K + Z_D)`, `Z_K = Σ_{t kept} exp z_t`, `Z_D = Σ_{t dropped} exp z_t`. From
`WitCert.Eviction.tv_softmax_kept_eq`. -/
theorem evict_tv_meter_eq {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (drop : β → Bool) (S : Sample Ω) (s : Site) (ω : Ω) (z : β → α)
    (hK : ∃ t ∈ L, drop t = false) :
    Analytic.tv ((evictTV E L hL drop S s).exact z) ((evictTV E L hL drop S s).approx ω z) L =
      Eviction.droppedMass (fun t => E.exp (z t)) drop L /
        (Eviction.keptMass (fun t => E.exp (z t)) drop L +
          Eviction.droppedMass (fun t => E.exp (z t)) drop L) :=
  Eviction.tv_softmax_kept_eq E z drop L hK

set_option linter.unusedSectionVars false in
/-- The eviction meter as a statement about `evictTV`: at every sample point, if some token of
`L` is kept and every dropped token's logit is at most its witness stored at eviction time,
`z_t ≤ u_t`, the output error of the contract at the logits `z` is at most
`U_D / (Z_K + U_D)`, `U_D = Σ_{t dropped} exp u_t`. From `WitCert.Eviction.tv_softmax_kept_eq`
and `WitCert.Eviction.dropped_mass_le_witness`. -/
theorem evict_tv_meter_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (drop : β → Bool) (S : Sample Ω) (s : Site) (ω : Ω) (z u : β → α)
    (hK : ∃ t ∈ L, drop t = false) (hu : ∀ t ∈ L, drop t = true → z t ≤ u t) :
    Analytic.tv ((evictTV E L hL drop S s).exact z) ((evictTV E L hL drop S s).approx ω z) L ≤
      Eviction.droppedMass (fun t => E.exp (u t)) drop L /
        (Eviction.keptMass (fun t => E.exp (z t)) drop L +
          Eviction.droppedMass (fun t => E.exp (u t)) drop L) := by
  have e : Analytic.tv ((evictTV E L hL drop S s).exact z)
      ((evictTV E L hL drop S s).approx ω z) L =
      Eviction.droppedMass (Analytic.softmax E z L) drop L :=
    (Eviction.tv_softmax_kept_eq E z drop L hK).trans
      (Eviction.dropped_mass_softmax_eq E z drop L).symm
  rw [e]
  exact Eviction.dropped_mass_le_witness E z u drop L hK hu

set_option linter.unusedSectionVars false in
/-- The eviction meter from block witnesses as a statement about `evictTV`: at every sample
point, if some token of `L` is kept and every dropped token lies in a listed evicted block
`blk t ∈ B` whose witness bounds its logit, `z_t ≤ u_{blk t}`, the output error of the contract
at the logits `z` is at most `U / (Z_K + U)`, `U = Σ_{b ∈ B} n_b exp u_b` with `n_b` the number
of dropped tokens of block `b`. From `WitCert.Eviction.tv_softmax_kept_eq` and
`WitCert.Eviction.dropped_mass_le_blocks`. -/
theorem evict_tv_blocks_meter_sound {Ω : Type} {β γ : Type} [DecidableEq γ]
    (E : Analytic.ExpLaws α) (L : List β) (hL : L ≠ []) (drop : β → Bool) (S : Sample Ω)
    (s : Site) (ω : Ω) (z : β → α) (u : γ → α) (blk : β → γ) (B : List γ)
    (hK : ∃ t ∈ L, drop t = false) (hu : ∀ t ∈ L, drop t = true → z t ≤ u (blk t))
    (hB : ∀ t ∈ L, drop t = true → blk t ∈ B) :
    Analytic.tv ((evictTV E L hL drop S s).exact z) ((evictTV E L hL drop S s).approx ω z) L ≤
      Analytic.lsum (fun b => Eviction.blockCount drop blk L b * E.exp (u b)) B /
        (Eviction.keptMass (fun t => E.exp (z t)) drop L +
          Analytic.lsum (fun b => Eviction.blockCount drop blk L b * E.exp (u b)) B) := by
  have e : Analytic.tv ((evictTV E L hL drop S s).exact z)
      ((evictTV E L hL drop S s).approx ω z) L =
      Eviction.droppedMass (Analytic.softmax E z L) drop L :=
    (Eviction.tv_softmax_kept_eq E z drop L hK).trans
      (Eviction.dropped_mass_softmax_eq E z drop L).symm
  rw [e]
  exact Eviction.dropped_mass_le_blocks E z u blk drop L B hK hu hB

set_option linter.unusedSectionVars false in
/-- The eviction meter with compressed kept keys as a statement about `evictTV`: at every sample
point, if some token of `L` is kept, the output error of the contract between the exact logits
`z` and the logits `z'` the engine computes from its compressed kept keys is at most the dropped
mass plus the compression error over the kept keys alone,
`TV ≤ Z_D / (Z_K + Z_D) + TV(softmax z (L kept), softmax z' (L kept))`, with
`Z_K = Σ_{t kept} exp z_t` and `Z_D = Σ_{t dropped} exp z_t`. From
`WitCert.Eviction.evict_quant_tv_le` and `WitCert.Eviction.dropped_mass_softmax_eq`. -/
theorem evict_quant_meter_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (drop : β → Bool) (S : Sample Ω) (s : Site) (ω : Ω) (z z' : β → α)
    (hK : ∃ t ∈ L, drop t = false) :
    Analytic.tv ((evictTV E L hL drop S s).exact z) ((evictTV E L hL drop S s).approx ω z') L ≤
      Eviction.droppedMass (fun t => E.exp (z t)) drop L /
          (Eviction.keptMass (fun t => E.exp (z t)) drop L +
            Eviction.droppedMass (fun t => E.exp (z t)) drop L) +
        Analytic.tv (Analytic.softmax E z (L.filter (fun t => !drop t)))
          (Analytic.softmax E z' (L.filter (fun t => !drop t))) (L.filter (fun t => !drop t)) := by
  rw [← Eviction.dropped_mass_softmax_eq E z drop L]
  exact Eviction.evict_quant_tv_le E z z' drop L hK

set_option linter.unusedSectionVars false in
/-- The eviction meter from block witnesses with compressed kept keys as a statement about
`evictTV`: at every sample point, if some token of `L` is kept and every dropped token lies in a
listed evicted block `blk t ∈ B` whose witness bounds its exact logit, `z_t ≤ u_{blk t}`, the
output error of the contract between the exact logits `z` and the computed logits `z'` is at
most `U / (Z_K + U) + TV(softmax z (L kept), softmax z' (L kept))`, with
`U = Σ_{b ∈ B} n_b exp u_b`. From `WitCert.Eviction.evict_quant_tv_le_blocks`. -/
theorem evict_quant_blocks_meter_sound {Ω : Type} {β γ : Type} [DecidableEq γ]
    (E : Analytic.ExpLaws α) (L : List β) (hL : L ≠ []) (drop : β → Bool) (S : Sample Ω)
    (s : Site) (ω : Ω) (z z' : β → α) (u : γ → α) (blk : β → γ) (B : List γ)
    (hK : ∃ t ∈ L, drop t = false) (hu : ∀ t ∈ L, drop t = true → z t ≤ u (blk t))
    (hB : ∀ t ∈ L, drop t = true → blk t ∈ B) :
    Analytic.tv ((evictTV E L hL drop S s).exact z) ((evictTV E L hL drop S s).approx ω z') L ≤
      Analytic.lsum (fun b => Eviction.blockCount drop blk L b * E.exp (u b)) B /
          (Eviction.keptMass (fun t => E.exp (z t)) drop L +
            Analytic.lsum (fun b => Eviction.blockCount drop blk L b * E.exp (u b)) B) +
        Analytic.tv (Analytic.softmax E z (L.filter (fun t => !drop t)))
          (Analytic.softmax E z' (L.filter (fun t => !drop t))) (L.filter (fun t => !drop t)) :=
  Eviction.evict_quant_tv_le_blocks E z z' u blk drop L B hK hu hB

set_option linter.unusedSectionVars false in
/-- Restoring evicted tokens keeps the certified block bound: at every sample point, if an
eviction `drop₀` keeps some token of `L`, its dropped tokens lie in listed blocks `blk t ∈ B`
whose witnesses bound their logits, `z_t ≤ u_{blk t}`, and the cache now drops only a subset of
them (`drop t → drop₀ t`, e.g. after a gate restored some blocks), the output error of
`evictTV` for `drop` at the logits `z` is at most the bound `U₀ / (Z_K₀ + U₀)` certified for
`drop₀`. From `evict_tv_blocks_meter_sound` and `WitCert.Eviction.restore_bound_le`. -/
theorem evict_tv_restore_meter_le {Ω : Type} {β γ : Type} [DecidableEq γ]
    (E : Analytic.ExpLaws α) (L : List β) (hL : L ≠ []) (drop drop₀ : β → Bool)
    (S : Sample Ω) (s : Site) (ω : Ω) (z : β → α) (u : γ → α) (blk : β → γ) (B : List γ)
    (hK : ∃ t ∈ L, drop₀ t = false) (hsub : ∀ t ∈ L, drop t = true → drop₀ t = true)
    (hu : ∀ t ∈ L, drop₀ t = true → z t ≤ u (blk t))
    (hB : ∀ t ∈ L, drop₀ t = true → blk t ∈ B) :
    Analytic.tv ((evictTV E L hL drop S s).exact z) ((evictTV E L hL drop S s).approx ω z) L ≤
      Analytic.lsum (fun b => Eviction.blockCount drop₀ blk L b * E.exp (u b)) B /
        (Eviction.keptMass (fun t => E.exp (z t)) drop₀ L +
          Analytic.lsum (fun b => Eviction.blockCount drop₀ blk L b * E.exp (u b)) B) := by
  have hK' : ∃ t ∈ L, drop t = false := by
    obtain ⟨t, ht, hf⟩ := hK
    refine ⟨t, ht, ?_⟩
    cases hd : drop t with
    | false => rfl
    | true =>
      have := hsub t ht hd
      rw [hf] at this
      cases this
  have h1 := evict_tv_blocks_meter_sound E L hL drop S s ω z u blk B hK'
    (fun t ht hd => hu t ht (hsub t ht hd)) (fun t ht hd => hB t ht (hsub t ht hd))
  exact Std.le_trans h1 (Eviction.restore_bound_le E z u blk drop₀ drop L B hK hsub)

end WitCert.Semantic

end
