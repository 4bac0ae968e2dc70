/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Semantic
public import WitCert.Dither

/-!
# Tier B as a semantic contract: the dithered logit read

`WitCert.Dither` proves the sub-Gaussian tail of a token's dither noise as an average over fair
sign vectors (`WitCert.Dither.dither_logit_tail`). This file turns it into a semantic contract
(`WitCert.Semantic.Contract`) with a real failure event: the sample space is the `2ⁿ` sign
vectors, the approximate map adds each token's dither noise to its logit, the failure event is
"some token's noise reaches the radius `r`", and its probability is bounded by the union of the
per-token tails, `Σ_t 2 exp (−r²/(2σ_t²))`. Outside the failure event the dithered logits are
within `1 · e_in + r` of the exact ones.

Formal companion of the Tier-B certificate of `witcert_calculus.meters.dither`.

## Main definitions

* `WitCert.Semantic.signVectors n`: the `2ⁿ` sign vectors `{−1, 1}ⁿ`, in the order of the tree
  of `WitCert.Dither.signAvg`.
* `WitCert.Semantic.signSample n`: the uniform sample space on them.
* `WitCert.Semantic.ditherBad`: the failure event, some token's noise at least `r` in absolute
  value.
* `WitCert.Semantic.ditherTierB`: the Tier-B contract from logits to dithered logits, with
  `a = 1`, `b = r`, `delta = Σ_t 2 exp (−r²/(2σ_t²))`, tier `certified`.

## Main statements

* `WitCert.Semantic.signSample_prob`: the probability of an event in the sign sample is the
  fair-sign average `signAvg n (ind ∘ E)` of `WitCert.Dither`.
* `WitCert.Semantic.dither_tier_b_sound`: outside the failure event, the sup-norm error of the
  dithered logits is at most `1 · e_in + r`.
* `WitCert.Semantic.dither_tier_b_prob_bad`: the failure event has probability at most
  `Σ_t 2 exp (−r²/(2σ_t²))` when `h² Σ_c w_{t,c}² ≤ 3σ_t²` for every token `t`.

## Implementation notes

* A token's dither noise is `dot (channelCoeffs e K (ws t)) ω`, the sum `Σ_c w_{t,c} V_c` of
  `WitCert.Dither.dither_logit_tail` read at the sign vector `ω`. Every token reads the one sign
  vector `ω` (its coefficients have the common length `n`), so the tokens' noises are dependent.
  The union bound (`WitCert.Dither.signAvg_union_le`) needs no independence between them: only
  each token's own tail enters the delta, so the same delta would bound the failure probability
  under any other coupling of the tokens' noises (independent draws per token included), which is
  not formalized here.
* The delta involves the exponential of `α` (`E : CoshLaws α`, no model over `Rat`), which is why
  `WitCert.Semantic.Sample.prob` and the deltas of semantic contracts live in the field `α`.
* The failure event is decided classically (`Classical.propDecidable`): it is a `Bool` for the
  sample space, never evaluated.
* Definitions are `noncomputable`: they are evaluated by the kernel, never run.
-/

@[expose] public section

namespace WitCert.Semantic

open WitCert.Dither WitCert.Analytic

attribute [local instance] Lean.Grind.Semiring.natCast

section Signs

variable {α : Type} [Lean.Grind.Field α]

/-- The `2ⁿ` sign vectors `{−1, 1}ⁿ`: those starting with `1`, then those starting with `−1`
(the two branches of `WitCert.Dither.signAvg`). -/
noncomputable def signVectors : Nat → List (List α)
  | 0 => [[]]
  | n + 1 => (signVectors n).map (fun s => 1 :: s) ++ (signVectors n).map (fun s => -1 :: s)

/-- There are `2ⁿ` sign vectors. -/
theorem signVectors_length (n : Nat) : (signVectors (α := α) n).length = 2 ^ n := by
  induction n with
  | zero => rfl
  | succ n ih =>
    simp only [signVectors, List.length_append, List.length_map, ih, Nat.pow_succ]
    omega

/-- `2ⁿ` is positive. -/
theorem nat_two_pow_pos (n : Nat) : 0 < 2 ^ n := by
  induction n with
  | zero => decide
  | succ n ih => rw [Nat.pow_succ]; omega

/-- There is at least one sign vector. -/
theorem signVectors_ne_nil (n : Nat) : signVectors (α := α) n ≠ [] := by
  intro h
  have hl := signVectors_length (α := α) n
  rw [h, List.length_nil] at hl
  have := nat_two_pow_pos n
  omega

/-- The uniform sample space on the `2ⁿ` sign vectors: `n` independent fair signs. -/
noncomputable def signSample (n : Nat) : Sample (List α) :=
  ⟨signVectors n, signVectors_ne_nil n⟩

end Signs

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- The number of sign vectors in the event `E`, cast to `α`, is `2ⁿ` times the fair-sign
average of its indicator. -/
theorem signVectors_count (n : Nat) (E : List α → Bool) :
    (((signVectors (α := α) n).filter E).length : α) =
      (2 : α) ^ n * signAvg n (fun s => ind (E s = true)) := by
  induction n generalizing E with
  | zero =>
    show (([([] : List α)].filter E).length : α) = (2 : α) ^ 0 * ind (E [] = true)
    rw [Lean.Grind.Semiring.pow_zero]
    have h1 := Lean.Grind.Semiring.natCast_succ (α := α) 0
    rw [Lean.Grind.Semiring.natCast_zero] at h1
    cases hE : E []
    · have hl : ([([] : List α)].filter E).length = 0 := by simp [hE]
      rw [ind_neg (by decide), hl, Lean.Grind.Semiring.natCast_zero]
      grind
    · have hl : ([([] : List α)].filter E).length = 1 := by simp [hE]
      rw [ind_pos rfl, hl]
      grind
  | succ n ih =>
    simp only [signVectors, List.filter_append, List.filter_map, List.length_append,
      List.length_map, Function.comp_def]
    rw [Sample.natCast_add, signAvg_succ, ih, ih, Lean.Grind.Semiring.pow_succ]
    grind

/-- The link between the two readings of probability: in the sign sample, the probability of
the event `E` is the fair-sign average `signAvg n (ind ∘ E)` of `WitCert.Dither`. -/
theorem signSample_prob (n : Nat) (E : List α → Bool) :
    (signSample n).prob (α := α) E = signAvg n (fun s => ind (E s = true)) := by
  have hc := signVectors_count (α := α) n E
  have hl : ((signVectors (α := α) n).length : α) = (2 : α) ^ n := by
    rw [signVectors_length, natCast_two_pow]
  have hp : (0 : α) < (2 : α) ^ n := by
    rw [← natCast_two_pow]
    exact Sample.natCast_pos (nat_two_pow_pos n)
  have hinv : (2 : α) ^ n * ((2 : α) ^ n)⁻¹ = 1 :=
    Lean.Grind.Field.mul_inv_cancel (by grind)
  show (((signVectors (α := α) n).filter E).length : α) /
      ((signVectors (α := α) n).length : α) = _
  rw [hc, hl, Lean.Grind.Field.div_eq_mul_inv]
  rw [show (2 : α) ^ n * signAvg n (fun s => ind (E s = true)) * ((2 : α) ^ n)⁻¹ =
      signAvg n (fun s => ind (E s = true)) * ((2 : α) ^ n * ((2 : α) ^ n)⁻¹) by grind, hinv]
  grind

/-! ### The Tier-B contract -/

variable {β : Type}

/-- The failure event of the dithered read: some token `t ∈ L` has noise at least `r` in
absolute value (decided classically). -/
noncomputable def ditherBad (L : List β) (e : α) (K : Nat) (ws : β → List α) (r : α)
    (ω : List α) : Bool :=
  @decide (∃ t ∈ L, r ≤ absA (dot (channelCoeffs e K (ws t)) ω)) (Classical.propDecidable _)

/-- The triangle inequality in the form used here: `|x − (y + d)| ≤ |x − y| + |d|`. -/
theorem absA_sub_add_le (x y d : α) : absA (x - (y + d)) ≤ absA (x - y) + absA d := by
  have h1 := le_of_absA_le (Std.le_refl (absA (x - y)))
  have h2 := le_of_absA_le (Std.le_refl (absA d))
  apply absA_le <;> grind

omit [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α] in
/-- The supremum over `L` is at most a nonnegative bound of every term. -/
theorem lsup_le_of_le (f : β → α) (L : List β) {c : α} (hc : 0 ≤ c)
    (h : ∀ t ∈ L, f t ≤ c) : lsup f L ≤ c := by
  induction L with
  | nil => exact hc
  | cons x L ih =>
    simp only [lsup]
    have hx := h x (by simp)
    have hL := ih (fun t ht => h t (by simp [ht]))
    unfold maxA
    split <;> grind

/-- Tier-B soundness: at a sign vector outside the failure event, the dithered logits
`z' t + noise_t` are within `1 · e_in + r` of the exact logits `z t` in the sup norm, where
`e_in = max_t |z t − z' t|`. -/
theorem dither_tier_b_sound (L : List β) (e : α) (K : Nat) (ws : β → List α) {r : α}
    (hr : 0 ≤ r) (ω : List α) (hω : ditherBad L e K ws r ω = false) (z z' : β → α) :
    lsup (fun t => absA (z t - (z' t + dot (channelCoeffs e K (ws t)) ω))) L ≤
      1 * lsup (fun t => absA (z t - z' t)) L + r := by
  have hnot : ¬∃ t ∈ L, r ≤ absA (dot (channelCoeffs e K (ws t)) ω) :=
    @of_decide_eq_false _ (Classical.propDecidable _) hω
  have hs := lsup_nonneg (fun t => absA (z t - z' t)) L
  apply lsup_le_of_le _ L (by grind)
  intro t ht
  have h1 := absA_sub_add_le (z t) (z' t) (dot (channelCoeffs e K (ws t)) ω)
  have h2 := le_lsup (fun t => absA (z t - z' t)) L t ht
  have h3 : ¬r ≤ absA (dot (channelCoeffs e K (ws t)) ω) := fun h => hnot ⟨t, ht, h⟩
  have h4 : absA (dot (channelCoeffs e K (ws t)) ω) < r := Std.not_le.mp h3
  grind

/-- Tier-B failure probability: if every token `t ∈ L` has `n` sign coefficients and
`h² Σ_c w_{t,c}² ≤ 3σ_t²` (`h = 2^K e`), the probability that some token's noise reaches `r`
is at most `Σ_t 2 exp (−r²/(2σ_t²))`. From `WitCert.Dither.signAvg_union_le` and
`WitCert.Dither.dither_logit_tail` through `signSample_prob`. -/
theorem dither_tier_b_prob_bad (E : CoshLaws α) (L : List β) (e : α) (K : Nat)
    (ws : β → List α) (n : Nat) (hn : ∀ t ∈ L, (channelCoeffs e K (ws t)).length = n)
    {r : α} (σ2 : β → α) (hr : 0 ≤ r) (hσ : ∀ t ∈ L, 0 < σ2 t)
    (hvar : ∀ t ∈ L, sumSq (ws t) * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2 t) :
    (signSample n).prob (α := α) (ditherBad L e K ws r) ≤
      lsum (fun t => 2 * E.exp (-(r * r / (2 * σ2 t)))) L := by
  rw [signSample_prob]
  have hbad : ∀ ω, (ind (ditherBad L e K ws r ω = true) : α) =
      ind (∃ t ∈ L, r ≤ absA (dot (channelCoeffs e K (ws t)) ω)) := by
    intro ω
    unfold ditherBad
    rw [@decide_eq_true_eq _ (Classical.propDecidable _)]
  rw [signAvg_congr hbad]
  have hu := signAvg_union_le (α := α) n
    (fun t ω => r ≤ absA (dot (channelCoeffs e K (ws t)) ω)) L
  have ht : lsum (fun t => signAvg n (fun ω => ind (r ≤ absA (dot (channelCoeffs e K (ws t)) ω)))) L ≤
      lsum (fun t => 2 * E.exp (-(r * r / (2 * σ2 t)))) L := by
    apply lsum_le
    intro t htL
    have h := dither_logit_tail E e K (ws t) hr (hσ t htL) (hvar t htL)
    rw [hn t htL] at h
    exact h
  exact Std.le_trans hu ht

/-- The Tier-B contract of the dithered logit read (Python: the Tier-B certificate of
`witcert_calculus.meters.dither`), over the sign sample `signSample n`: the exact map keeps the
logits, the approximate map at the sign vector `ω` adds each token's dither noise,
`(a, b) = (1, r)`, the failure event is `ditherBad` and `delta = Σ_t 2 exp (−r²/(2σ_t²))`;
tier `certified` (a proof, with a failure probability). -/
noncomputable def ditherTierB (E : CoshLaws α) (L : List β) (e : α) (K : Nat)
    (ws : β → List α) (n : Nat) (hn : ∀ t ∈ L, (channelCoeffs e K (ws t)).length = n)
    (r : α) (σ2 : β → α) (hr : 0 ≤ r) (hσ : ∀ t ∈ L, 0 < σ2 t)
    (hvar : ∀ t ∈ L, sumSq (ws t) * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2 t)
    (s : Site) : Contract (signSample (α := α) n) (logitSpace (α := α) L s) (logitSpace L s) where
  exact z := z
  approx ω z' := fun t => z' t + dot (channelCoeffs e K (ws t)) ω
  a := 1
  b := r
  a_nonneg := Std.le_of_lt (Lean.Grind.OrderedRing.zero_lt_one (R := α))
  dom _ := True
  dom_down _ h := h
  bad := ditherBad L e K ws r
  delta := lsum (fun t => 2 * E.exp (-(r * r / (2 * σ2 t)))) L
  prob_bad := dither_tier_b_prob_bad E L e K ws n hn σ2 hr hσ hvar
  tier := .certified
  sound ω hω z z' _ := dither_tier_b_sound L e K ws hr ω hω z z'

/-- The numbers of the Tier-B contract: `a = 1`, `b = r`, `delta = Σ_t 2 exp (−r²/(2σ_t²))`,
tier `certified`. -/
theorem ditherTierB_numbers (E : CoshLaws α) (L : List β) (e : α) (K : Nat)
    (ws : β → List α) (n : Nat) (hn : ∀ t ∈ L, (channelCoeffs e K (ws t)).length = n)
    (r : α) (σ2 : β → α) (hr : 0 ≤ r) (hσ : ∀ t ∈ L, 0 < σ2 t)
    (hvar : ∀ t ∈ L, sumSq (ws t) * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2 t)
    (s : Site) :
    (ditherTierB E L e K ws n hn r σ2 hr hσ hvar s).a = 1 ∧
      (ditherTierB E L e K ws n hn r σ2 hr hσ hvar s).b = r ∧
      (ditherTierB E L e K ws n hn r σ2 hr hσ hvar s).delta =
        lsum (fun t => 2 * E.exp (-(r * r / (2 * σ2 t)))) L ∧
      (ditherTierB E L e K ws n hn r σ2 hr hσ hvar s).tier = .certified :=
  ⟨rfl, rfl, rfl, rfl⟩

end WitCert.Semantic

end
