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
vectors, the approximate map adds to each token's logit a deterministic offset `d_t` and its
dither noise, the failure event is "some token's noise reaches its radius `r_t`", and its
probability is bounded by the union of the per-token tails, `Σ_t 2 exp (−r_t²/(2σ_t²))`.
Outside the failure event every token's dithered logit is within `|z_t − z'_t| + (g_t + r_t)`
of the exact one (`|d_t| ≤ g_t`), the per-token bound `u_t = radius_t + mean_t` of the Python
meter, and the sup-norm error is within `1 · e_in + max_t (g_t + r_t)`.

Formal companion of the Tier-B certificate of `witcert_calculus.meters.dither`.

## Main definitions

* `WitCert.Semantic.signVectors n`: the `2ⁿ` sign vectors `{−1, 1}ⁿ`, in the order of the tree
  of `WitCert.Dither.signAvg`.
* `WitCert.Semantic.signSample n`: the uniform sample space on them.
* `WitCert.Semantic.ditherBad`: the failure event, some token `t` whose noise is at least its
  radius `r t` in absolute value.
* `WitCert.Semantic.ditherTierB`: the Tier-B contract from logits to dithered logits
  `z' t + d t + noise_t`, with `a = 1`, `b = max_t (g_t + r_t)` (`lsup`),
  `delta = Σ_t 2 exp (−r_t²/(2σ_t²))`, tier `certified`.

## Main statements

* `WitCert.Semantic.signSample_prob`: the probability of an event in the sign sample is the
  fair-sign average `signAvg n (ind ∘ E)` of `WitCert.Dither`.
* `WitCert.Semantic.dither_tier_b_token_sound`: outside the failure event, every token's
  dithered logit is within `|z_t − z'_t| + (g_t + r_t)` of the exact one (the per-token bound
  `u_t = radius_t + mean_t` of the Python meter).
* `WitCert.Semantic.dither_tier_b_sound`: outside the failure event, the sup-norm error of the
  dithered logits is at most `1 · e_in + max_t (g_t + r_t)`.
* `WitCert.Semantic.dither_tier_b_prob_bad`: the failure event has probability at most
  `Σ_t 2 exp (−r_t²/(2σ_t²))` when `h² Σ_c w_{t,c}² ≤ 3σ_t²` for every token `t`.
* `WitCert.Semantic.ditherTierB_numbers`: the contract's `a`, `b`, `delta` and tier.

## Implementation notes

* A token's dither noise is `dot (channelCoeffs e K (ws t)) ω`, the sum `Σ_c w_{t,c} V_c` of
  `WitCert.Dither.dither_logit_tail` read at the sign vector `ω`. One sign vector `ω` serves all
  the tokens (their coefficients have the common length `n`), so the tokens' noises are
  dependent. The union bound (`WitCert.Dither.signAvg_union_le`) needs no independence between
  them: only each token's own tail enters the delta, so the same delta would bound the failure
  probability under any other coupling of the tokens' noises (independent draws per token
  included), which is not formalized here.
* Each token has its own radius `r t` (Python: `radius_t = sqrt(2 ς_t² log(2S/δ))`, from its
  own variance proxy `ς_t² = σ2 t`), so the delta is the sum of the per-token tails at their own
  radii (`δ/S` each in Python).
* The deterministic offset `d t` (`|d t| ≤ g t`) models the mean term of the offset grid of the
  Python meter (`dither_mean_offset`, bounded by `mean_t`): it is not random, so it enters the
  bound `b` and not the failure event.
* The delta involves the exponential of `α` (`E : CoshLaws α`, no model over `Rat`), which is why
  `WitCert.Semantic.Sample.prob` and the deltas of semantic contracts live in the field `α`.
* The failure event is decided classically (`Classical.propDecidable`): it is a `Bool` for the
  sample space, never evaluated.
* The contract is built from the statements on the raw maps (`dither_token_le`,
  `dither_sup_le`, `ditherBad_prob_le`); the `dither_tier_b_*` statements restate them about the
  contract's own fields.
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

/-- The failure event of the dithered read: some token `t ∈ L` has noise at least its radius
`r t` in absolute value (decided classically). -/
noncomputable def ditherBad (L : List β) (e : α) (K : Nat) (ws : β → List α) (r : β → α)
    (ω : List α) : Bool :=
  @decide (∃ t ∈ L, r t ≤ absA (dot (channelCoeffs e K (ws t)) ω)) (Classical.propDecidable _)

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

/-- One token outside the failure event, on the raw maps: the logit `z' t + d t + noise_t` is
within `|z t − z' t| + (g t + r t)` of `z t` when `|d t| ≤ g t`. -/
theorem dither_token_le (L : List β) (e : α) (K : Nat) (ws : β → List α) (r d g : β → α)
    (hd : ∀ t ∈ L, absA (d t) ≤ g t) (ω : List α) (hω : ditherBad L e K ws r ω = false)
    (z z' : β → α) (t : β) (ht : t ∈ L) :
    absA (z t - (z' t + d t + dot (channelCoeffs e K (ws t)) ω)) ≤
      absA (z t - z' t) + (g t + r t) := by
  have hnot : ¬∃ t ∈ L, r t ≤ absA (dot (channelCoeffs e K (ws t)) ω) :=
    @of_decide_eq_false _ (Classical.propDecidable _) hω
  have h3 : ¬r t ≤ absA (dot (channelCoeffs e K (ws t)) ω) := fun h => hnot ⟨t, ht, h⟩
  have h4 : absA (dot (channelCoeffs e K (ws t)) ω) < r t := Std.not_le.mp h3
  have h1 := absA_sub_add_le (z t) (z' t + d t) (dot (channelCoeffs e K (ws t)) ω)
  have h2 := absA_sub_add_le (z t) (z' t) (d t)
  have h5 := hd t ht
  grind

/-- The sup-norm bound outside the failure event, on the raw maps: the dithered logits are within
`1 · e_in + max_t (g t + r t)` of the exact logits, `e_in = max_t |z t − z' t|`. -/
theorem dither_sup_le (L : List β) (e : α) (K : Nat) (ws : β → List α) (r d g : β → α)
    (hd : ∀ t ∈ L, absA (d t) ≤ g t) (ω : List α) (hω : ditherBad L e K ws r ω = false)
    (z z' : β → α) :
    lsup (fun t => absA (z t - (z' t + d t + dot (channelCoeffs e K (ws t)) ω))) L ≤
      1 * lsup (fun t => absA (z t - z' t)) L + lsup (fun t => g t + r t) L := by
  have hs := lsup_nonneg (fun t => absA (z t - z' t)) L
  have hb := lsup_nonneg (fun t => g t + r t) L
  apply lsup_le_of_le _ L (by grind)
  intro t ht
  have h1 := dither_token_le L e K ws r d g hd ω hω z z' t ht
  have h2 := le_lsup (fun t => absA (z t - z' t)) L t ht
  have h3 := le_lsup (fun t => g t + r t) L t ht
  grind

/-- The failure probability, on the raw event: if every token `t ∈ L` has `n` sign coefficients
and `h² Σ_c w_{t,c}² ≤ 3σ_t²` (`h = 2^K e`), the probability that some token's noise reaches its
radius `r t` is at most `Σ_t 2 exp (−r_t²/(2σ_t²))`. From `WitCert.Dither.signAvg_union_le` and
`WitCert.Dither.dither_logit_tail` through `signSample_prob`. -/
theorem ditherBad_prob_le (E : CoshLaws α) (L : List β) (e : α) (K : Nat)
    (ws : β → List α) (n : Nat) (hn : ∀ t ∈ L, (channelCoeffs e K (ws t)).length = n)
    (r σ2 : β → α) (hr : ∀ t ∈ L, 0 ≤ r t) (hσ : ∀ t ∈ L, 0 < σ2 t)
    (hvar : ∀ t ∈ L, sumSq (ws t) * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2 t) :
    (signSample n).prob (α := α) (ditherBad L e K ws r) ≤
      lsum (fun t => 2 * E.exp (-(r t * r t / (2 * σ2 t)))) L := by
  rw [signSample_prob]
  have hbad : ∀ ω, (ind (ditherBad L e K ws r ω = true) : α) =
      ind (∃ t ∈ L, r t ≤ absA (dot (channelCoeffs e K (ws t)) ω)) := by
    intro ω
    unfold ditherBad
    rw [@decide_eq_true_eq _ (Classical.propDecidable _)]
  rw [signAvg_congr hbad]
  have hu := signAvg_union_le (α := α) n
    (fun t ω => r t ≤ absA (dot (channelCoeffs e K (ws t)) ω)) L
  have ht : lsum (fun t =>
      signAvg n (fun ω => ind (r t ≤ absA (dot (channelCoeffs e K (ws t)) ω)))) L ≤
      lsum (fun t => 2 * E.exp (-(r t * r t / (2 * σ2 t)))) L := by
    apply lsum_le
    intro t htL
    have h := dither_logit_tail E e K (ws t) (hr t htL) (hσ t htL) (hvar t htL)
    rw [hn t htL] at h
    exact h
  exact Std.le_trans hu ht

/-- The Tier-B contract of the dithered logit read (Python: the Tier-B certificate of
`witcert_calculus.meters.dither`), over the sign sample `signSample n`: the exact map keeps the
logits, the approximate map at the sign vector `ω` adds to each token's logit the deterministic
offset `d t` (`|d t| ≤ g t`, the grid's mean term) and its dither noise,
`(a, b) = (1, max_t (g t + r t))`, the failure event is `ditherBad` (some token's noise at least
its radius `r t`) and `delta = Σ_t 2 exp (−r_t²/(2σ_t²))`; tier `certified` (a proof, with a
failure probability). -/
noncomputable def ditherTierB (E : CoshLaws α) (L : List β) (e : α) (K : Nat)
    (ws : β → List α) (n : Nat) (hn : ∀ t ∈ L, (channelCoeffs e K (ws t)).length = n)
    (r σ2 d g : β → α) (hr : ∀ t ∈ L, 0 ≤ r t) (hσ : ∀ t ∈ L, 0 < σ2 t)
    (hvar : ∀ t ∈ L, sumSq (ws t) * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2 t)
    (hd : ∀ t ∈ L, absA (d t) ≤ g t)
    (s : Site) : Contract (signSample (α := α) n) (logitSpace (α := α) L s) (logitSpace L s) where
  exact z := z
  approx ω z' := fun t => z' t + d t + dot (channelCoeffs e K (ws t)) ω
  a := 1
  b := lsup (fun t => g t + r t) L
  a_nonneg := Std.le_of_lt (Lean.Grind.OrderedRing.zero_lt_one (R := α))
  dom _ := True
  dom_down _ h := h
  bad := ditherBad L e K ws r
  delta := lsum (fun t => 2 * E.exp (-(r t * r t / (2 * σ2 t)))) L
  prob_bad := ditherBad_prob_le E L e K ws n hn r σ2 hr hσ hvar
  tier := .certified
  sound ω hω z z' _ := dither_sup_le L e K ws r d g hd ω hω z z'

/-- Tier-B soundness per token (the bound `u_t = radius_t + mean_t` of the Python meter): at a
sign vector outside the contract's failure event, every token `t ∈ L` of the contract's dithered
logits is within `|z t − z' t| + (g t + r t)` of the exact logit `z t`. -/
theorem dither_tier_b_token_sound (E : CoshLaws α) (L : List β) (e : α) (K : Nat)
    (ws : β → List α) (n : Nat) (hn : ∀ t ∈ L, (channelCoeffs e K (ws t)).length = n)
    (r σ2 d g : β → α) (hr : ∀ t ∈ L, 0 ≤ r t) (hσ : ∀ t ∈ L, 0 < σ2 t)
    (hvar : ∀ t ∈ L, sumSq (ws t) * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2 t)
    (hd : ∀ t ∈ L, absA (d t) ≤ g t) (s : Site) (ω : List α)
    (hω : (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).bad ω = false)
    (z z' : β → α) (t : β) (ht : t ∈ L) :
    absA (z t - (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).approx ω z' t) ≤
      absA (z t - z' t) + (g t + r t) :=
  dither_token_le L e K ws r d g hd ω hω z z' t ht

/-- Tier-B soundness, the contract's soundness field with the bound written out: at a sign
vector outside the failure event, the sup-norm error of the dithered logits is at most
`1 · e_in + max_t (g t + r t)`, where `e_in = max_t |z t − z' t|`. -/
theorem dither_tier_b_sound (E : CoshLaws α) (L : List β) (e : α) (K : Nat)
    (ws : β → List α) (n : Nat) (hn : ∀ t ∈ L, (channelCoeffs e K (ws t)).length = n)
    (r σ2 d g : β → α) (hr : ∀ t ∈ L, 0 ≤ r t) (hσ : ∀ t ∈ L, 0 < σ2 t)
    (hvar : ∀ t ∈ L, sumSq (ws t) * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2 t)
    (hd : ∀ t ∈ L, absA (d t) ≤ g t) (s : Site) (ω : List α)
    (hω : (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).bad ω = false)
    (z z' : β → α) :
    lsup (fun t => absA ((ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).exact z t -
        (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).approx ω z' t)) L ≤
      1 * lsup (fun t => absA (z t - z' t)) L + lsup (fun t => g t + r t) L :=
  (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).sound ω hω z z' trivial

/-- Tier-B failure probability: if every token `t ∈ L` has `n` sign coefficients and
`h² Σ_c w_{t,c}² ≤ 3σ_t²` (`h = 2^K e`), the contract's failure event (some token's noise
reaches its radius `r t`) has probability at most `Σ_t 2 exp (−r_t²/(2σ_t²))` in the sign
sample. -/
theorem dither_tier_b_prob_bad (E : CoshLaws α) (L : List β) (e : α) (K : Nat)
    (ws : β → List α) (n : Nat) (hn : ∀ t ∈ L, (channelCoeffs e K (ws t)).length = n)
    (r σ2 d g : β → α) (hr : ∀ t ∈ L, 0 ≤ r t) (hσ : ∀ t ∈ L, 0 < σ2 t)
    (hvar : ∀ t ∈ L, sumSq (ws t) * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2 t)
    (hd : ∀ t ∈ L, absA (d t) ≤ g t) (s : Site) :
    (signSample n).prob (α := α) (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).bad ≤
      lsum (fun t => 2 * E.exp (-(r t * r t / (2 * σ2 t)))) L :=
  (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).prob_bad

/-- The numbers of the Tier-B contract: `a = 1`, `b = max_t (g t + r t)`,
`delta = Σ_t 2 exp (−r_t²/(2σ_t²))`, tier `certified`. -/
theorem ditherTierB_numbers (E : CoshLaws α) (L : List β) (e : α) (K : Nat)
    (ws : β → List α) (n : Nat) (hn : ∀ t ∈ L, (channelCoeffs e K (ws t)).length = n)
    (r σ2 d g : β → α) (hr : ∀ t ∈ L, 0 ≤ r t) (hσ : ∀ t ∈ L, 0 < σ2 t)
    (hvar : ∀ t ∈ L, sumSq (ws t) * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2 t)
    (hd : ∀ t ∈ L, absA (d t) ≤ g t) (s : Site) :
    (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).a = 1 ∧
      (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).b = lsup (fun t => g t + r t) L ∧
      (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).delta =
        lsum (fun t => 2 * E.exp (-(r t * r t / (2 * σ2 t)))) L ∧
      (ditherTierB E L e K ws n hn r σ2 d g hr hσ hvar hd s).tier = .certified :=
  ⟨rfl, rfl, rfl, rfl⟩

end WitCert.Semantic

end
