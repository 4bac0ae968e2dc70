/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Analytic
public import WitCert.Output

/-!
# Token eviction: the dropped mass is the attention error

A cache that evicts tokens keeps the tokens `K` of a list `L` and drops the tokens `D`
(`drop t = true`). Attention over the full cache is a distribution `p` over the tokens of `L`;
attention over the kept keys is `p` restricted to `K` and renormalized,
`p_K(t) = p_t / p(K)` for a kept token and `0` for a dropped one.

## Main definitions

* `WitCert.Eviction.keptMass`, `WitCert.Eviction.droppedMass`: `p(K) = Σ_{t kept} p_t` and
  `p(D) = Σ_{t dropped} p_t`.
* `WitCert.Eviction.restrict`: `p_K`, the restriction of `p` to the kept tokens, renormalized.
* `WitCert.Eviction.blockCount`: the number `n_b` of dropped tokens of block `b` (in the carrier).

## Main statements

* `WitCert.Eviction.tv_restrict_eq_dropped_mass`: `TV(p, p_K) = p(D)` exactly.
* `WitCert.Eviction.dropped_mass_softmax_eq`: for `p = softmax s`, `p(D) = Z_D / (Z_K + Z_D)`.
* `WitCert.Eviction.restrict_softmax_eq`: the renormalized restriction of `softmax s` is the
  softmax over the kept tokens alone; `WitCert.Eviction.tv_softmax_kept_eq`: so
  `TV(softmax s, softmax s over the kept tokens) = Z_D / (Z_K + Z_D)`.
* `WitCert.Eviction.tv_kept_le_one`: whatever the logits, that distance is at most `1` (the
  soundness of the contract `WitCert.Semantic.evictTV`, `WitCert/SemanticEviction.lean`).
* `WitCert.Eviction.dropped_mass_le_witness`: logits of dropped tokens bounded by witnesses,
  `s_t ≤ u_t`, give `p(D) ≤ U_D / (Z_K + U_D)` with `U_D = Σ_{t dropped} exp u_t`.
* `WitCert.Eviction.witness_mass_le_blocks`: a block-constant witness `u_b` gives
  `U_D ≤ Σ_b n_b exp u_b`; `WitCert.Eviction.dropped_mass_le_blocks`: the two together.
* `WitCert.Eviction.tv_triangle`: `TV(p, r) ≤ TV(p, q) + TV(q, r)`;
  `WitCert.Eviction.tv_cond_drop_eq_tv_filter`: weights that vanish at the dropped tokens are
  as far apart over `L` as over the kept tokens alone.
* `WitCert.Eviction.evict_quant_tv_le`: eviction with compressed kept keys, served as the
  softmax of perturbed logits `s'` over the kept tokens, is within
  `p(D) + TV(softmax s (L kept), softmax s' (L kept))` of `softmax s`;
  `WitCert.Eviction.evict_quant_tv_le_blocks`: the same with `p(D) ≤ U / (Z_K + U)`.
* `WitCert.Eviction.div_add_le_div_add`: `x / (Z' + x) ≤ x' / (Z + x')` for `0 < Z ≤ Z'`,
  `0 ≤ x ≤ x'`; `WitCert.Eviction.restore_bound_le`: dropping a subset of the tokens does not
  raise the block bound `U / (Z_K + U)`; `WitCert.Eviction.restore_block_bound_le`: so
  restoring one evicted block (the greedy step of a restoring gate) does not raise it.
* `WitCert.Eviction.output_evict_error_le`: the attention outputs over the full and over the
  kept cache differ by at most `p(D) · (max_{t dropped} ‖v_t‖ + ‖o_K‖)`.

## Implementation notes

The carrier `α` is that of `WitCert.Analytic` (core's ordered-field classes), the exponential
is given by `WitCert.Analytic.ExpLaws` and the value space by `WitCert.Output.NormedLaws`, with
one more law stated as a hypothesis of the output bound: `(a b) • x = a • (b • x)`, which every
real vector space satisfies. Sums run over the list `L` with its multiplicities, as in
`WitCert.Analytic.tv`, so no hypothesis of distinct tokens is needed. The set of dropped tokens
is a Boolean predicate, as the paged block of `WitCert.Meters.page_in_decrease`.

Each theorem keeps the section's whole carrier context, classes its proof does not use
included: they are part of its statement as exported and locked (`formal/statements.lock.json`).
Where one goes unused, the `unusedSectionVars` linter is switched off for that theorem alone
(`set_option ... in`) instead of omitting the class, which would change the statement.
-/

@[expose] public section

namespace WitCert.Eviction

open WitCert.Analytic WitCert.Output

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- The mass `p(K) = Σ_{t kept} p_t` of the kept tokens (`drop t = false`) of `L`. -/
noncomputable def keptMass {β : Type} (p : β → α) (drop : β → Bool) (L : List β) : α :=
  lsum (fun t => cond (drop t) 0 (p t)) L

/-- The mass `p(D) = Σ_{t dropped} p_t` of the dropped tokens (`drop t = true`) of `L`. -/
noncomputable def droppedMass {β : Type} (p : β → α) (drop : β → Bool) (L : List β) : α :=
  lsum (fun t => cond (drop t) (p t) 0) L

/-- Attention over the kept keys: `p` restricted to the kept tokens and renormalized,
`p_K(t) = p_t / p(K)` for a kept token, `0` for a dropped one. -/
noncomputable def restrict {β : Type} (p : β → α) (drop : β → Bool) (L : List β) (t : β) : α :=
  cond (drop t) 0 (p t / keptMass p drop L)

/-- The number `n_b` of dropped tokens of `L` in block `b` (`blk t = b`), in the carrier. -/
noncomputable def blockCount {β γ : Type} [DecidableEq γ] (drop : β → Bool) (blk : β → γ)
    (L : List β) (b : γ) : α :=
  lsum (fun t => cond (drop t && decide (blk t = b)) 1 0) L

/-! ### Mass bookkeeping -/

set_option linter.unusedSectionVars false in
private theorem mass_split {β : Type} (p : β → α) (drop : β → Bool) (L : List β) :
    lsum p L = keptMass p drop L + droppedMass p drop L := by
  induction L with
  | nil => simp only [keptMass, droppedMass, lsum]; grind
  | cons x xs ih =>
    simp only [keptMass, droppedMass, lsum] at ih ⊢
    cases hd : drop x with
    | false => simp only [cond_false]; grind
    | true => simp only [cond_true]; grind

set_option linter.unusedSectionVars false in
private theorem kept_nonneg {β : Type} (p : β → α) (drop : β → Bool) (L : List β)
    (hp : ∀ t ∈ L, 0 ≤ p t) : 0 ≤ keptMass p drop L := by
  induction L with
  | nil => simp only [keptMass, lsum]; grind
  | cons x xs ih =>
    have ih' := ih (fun t ht => hp t (by simp [ht]))
    have hx := hp x (by simp)
    simp only [keptMass, lsum] at ih' ⊢
    cases hd : drop x with
    | false => simp only [cond_false]; grind
    | true => simp only [cond_true]; grind

set_option linter.unusedSectionVars false in
private theorem dropped_nonneg {β : Type} (p : β → α) (drop : β → Bool) (L : List β)
    (hp : ∀ t ∈ L, 0 ≤ p t) : 0 ≤ droppedMass p drop L := by
  induction L with
  | nil => simp only [droppedMass, lsum]; grind
  | cons x xs ih =>
    have ih' := ih (fun t ht => hp t (by simp [ht]))
    have hx := hp x (by simp)
    simp only [droppedMass, lsum] at ih' ⊢
    cases hd : drop x with
    | false => simp only [cond_false]; grind
    | true => simp only [cond_true]; grind

set_option linter.unusedSectionVars false in
private theorem dropped_div {β : Type} (w : β → α) (Z : α) (drop : β → Bool) (L : List β) :
    droppedMass (fun t => w t / Z) drop L = droppedMass w drop L / Z := by
  induction L with
  | nil => simp only [droppedMass, lsum]; grind
  | cons x xs ih =>
    simp only [droppedMass, lsum] at ih ⊢
    cases hd : drop x with
    | false => simp only [cond_false]; grind
    | true => simp only [cond_true]; grind

set_option linter.unusedSectionVars false in
/-- The per-token absolute differences of `p` and its renormalized restriction, summed, for a
fixed normalizer `K` with `1/K ≥ 1`. -/
private theorem abs_restrict_sum {β : Type} (p : β → α) (drop : β → Bool) (L : List β) (K : α)
    (hp : ∀ t ∈ L, 0 ≤ p t) (hc : 0 ≤ 1 / K - 1) :
    lsum (fun t => absA (p t - cond (drop t) 0 (p t / K))) L =
      droppedMass p drop L + (1 / K - 1) * keptMass p drop L := by
  induction L with
  | nil => simp only [droppedMass, keptMass, lsum]; grind
  | cons x xs ih =>
    have ih' := ih (fun t ht => hp t (by simp [ht]))
    have hx := hp x (by simp)
    simp only [droppedMass, keptMass, lsum] at ih' ⊢
    cases hd : drop x with
    | false =>
      simp only [cond_false]
      have hm := Lean.Grind.OrderedRing.mul_nonneg hx hc
      have ha : absA (p x - p x / K) = (1 / K - 1) * p x := by
        unfold absA; split <;> grind
      grind
    | true =>
      simp only [cond_true]
      have ha : absA (p x - 0) = p x := by
        unfold absA; split <;> grind
      grind

/-! ### The total variation of eviction -/

set_option linter.unusedSectionVars false in
/-- Eviction costs exactly the dropped mass in total variation: for a distribution `p` over the
tokens of `L` (`p_t ≥ 0`, `Σ_t p_t = 1`) whose kept tokens have positive mass `p(K) > 0`, the
distance between `p` and its restriction to the kept tokens, renormalized
(`p_K(t) = p_t / p(K)` kept, `0` dropped), is `TV(p, p_K) = p(D)`, the mass of the dropped
tokens. -/
theorem tv_restrict_eq_dropped_mass {β : Type} (p : β → α) (drop : β → Bool) (L : List β)
    (hp : ∀ t ∈ L, 0 ≤ p t) (h1 : lsum p L = 1) (hK : 0 < keptMass p drop L) :
    tv p (restrict p drop L) L = droppedMass p drop L := by
  have hs := mass_split p drop L
  have hD := dropped_nonneg p drop L hp
  have hinv := inv_pos_of_pos hK
  have hm := Lean.Grind.OrderedRing.mul_nonneg
    (show (0 : α) ≤ 1 - keptMass p drop L by grind) (Std.le_of_lt hinv)
  have hc : 0 ≤ 1 / keptMass p drop L - 1 := by grind
  have e := abs_restrict_sum p drop L (keptMass p drop L) hp hc
  have e2 : tv p (restrict p drop L) L = (1 / 2) *
      lsum (fun t => absA (p t - cond (drop t) 0 (p t / keptMass p drop L))) L := rfl
  rw [e2, e]
  grind

set_option linter.unusedSectionVars false in
/-- The dropped mass of softmax attention: for `p = softmax s` over the tokens of `L`,
`p(D) = Z_D / (Z_K + Z_D)` with `Z_K = Σ_{t kept} exp s_t` and `Z_D = Σ_{t dropped} exp s_t`. -/
theorem dropped_mass_softmax_eq {β : Type} (E : ExpLaws α) (s : β → α) (drop : β → Bool)
    (L : List β) :
    droppedMass (softmax E s L) drop L =
      droppedMass (fun t => E.exp (s t)) drop L /
        (keptMass (fun t => E.exp (s t)) drop L + droppedMass (fun t => E.exp (s t)) drop L) := by
  have hdiv : droppedMass (softmax E s L) drop L =
      droppedMass (fun t => E.exp (s t)) drop L / lsum (fun t => E.exp (s t)) L :=
    dropped_div (fun t => E.exp (s t)) (lsum (fun t => E.exp (s t)) L) drop L
  have hsplit : lsum (fun t => E.exp (s t)) L =
      keptMass (fun t => E.exp (s t)) drop L + droppedMass (fun t => E.exp (s t)) drop L :=
    mass_split (fun t => E.exp (s t)) drop L
  rw [hdiv, hsplit]

/-! ### Witness bounds on the dropped mass -/

set_option linter.unusedSectionVars false in
private theorem mul_div_cancel_pos {d z : α} (hd : 0 < d) : d * (z / d) = z := by
  grind

set_option linter.unusedSectionVars false in
/-- `x / (a + x)` is monotone in `x ≥ 0` for `a > 0`. -/
private theorem frac_mono {a x y : α} (ha : 0 < a) (hx : 0 ≤ x) (hxy : x ≤ y) :
    x / (a + x) ≤ y / (a + y) := by
  have hd1 : 0 < a + x := by grind
  have hd2 : 0 < a + y := by grind
  have hc := Lean.Grind.OrderedRing.mul_pos hd1 hd2
  have hax := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hxy (Std.le_of_lt ha)
  have e1 := mul_div_cancel_pos (z := x) hd1
  have e2 := mul_div_cancel_pos (z := y) hd2
  have f1 : (a + x) * (a + y) * (x / (a + x)) = x * (a + y) := by
    rw [show (a + x) * (a + y) * (x / (a + x)) = (a + y) * ((a + x) * (x / (a + x))) by grind,
      e1]
    grind
  have f2 : (a + x) * (a + y) * (y / (a + y)) = y * (a + x) := by
    rw [show (a + x) * (a + y) * (y / (a + y)) = (a + x) * ((a + y) * (y / (a + y))) by grind,
      e2]
    grind
  apply le_of_mul_le_mul_left_pos hc
  rw [f1, f2]
  grind

set_option linter.unusedSectionVars false in
private theorem kept_exp_pos {β : Type} (E : ExpLaws α) (s : β → α) (drop : β → Bool)
    (L : List β) (hK : ∃ t ∈ L, drop t = false) :
    0 < keptMass (fun t => E.exp (s t)) drop L := by
  induction L with
  | nil =>
    obtain ⟨t, ht, _⟩ := hK
    cases ht
  | cons x xs ih =>
    have hn : 0 ≤ keptMass (fun t => E.exp (s t)) drop xs :=
      kept_nonneg (fun t => E.exp (s t)) drop xs (fun t _ => Std.le_of_lt (E.exp_pos (s t)))
    have hx := E.exp_pos (s x)
    cases hd : drop x with
    | false =>
      simp only [keptMass, lsum] at hn ⊢
      simp only [hd, cond_false]
      grind
    | true =>
      have hK' : ∃ t ∈ xs, drop t = false := by
        obtain ⟨t, ht, hf⟩ := hK
        rcases List.mem_cons.mp ht with h | h
        · subst h
          rw [hd] at hf
          cases hf
        · exact ⟨t, h, hf⟩
      have ih' := ih hK'
      simp only [keptMass, lsum] at ih' ⊢
      simp only [hd, cond_true]
      grind

set_option linter.unusedSectionVars false in
private theorem dropped_exp_le {β : Type} (E : ExpLaws α) (s u : β → α) (drop : β → Bool)
    (L : List β) (hu : ∀ t ∈ L, drop t = true → s t ≤ u t) :
    droppedMass (fun t => E.exp (s t)) drop L ≤ droppedMass (fun t => E.exp (u t)) drop L := by
  induction L with
  | nil => simp only [droppedMass, lsum]; grind
  | cons x xs ih =>
    have ih' := ih (fun t ht hd => hu t (by simp [ht]) hd)
    simp only [droppedMass, lsum] at ih' ⊢
    cases hd : drop x with
    | false => simp only [cond_false]; grind
    | true =>
      have := E.exp_le_exp (hu x (by simp) hd)
      simp only [cond_true]
      grind

set_option linter.unusedSectionVars false in
/-- The eviction witness bound: if the kept tokens are not all dropped (some `t ∈ L` has
`drop t = false`) and every dropped token's logit is at most a witness stored at eviction time,
`s_t ≤ u_t`, then the dropped mass of `p = softmax s` is at most
`p(D) = Z_D / (Z_K + Z_D) ≤ U_D / (Z_K + U_D)` with `Z_K = Σ_{t kept} exp s_t` and
`U_D = Σ_{t dropped} exp u_t` (`x / (Z_K + x)` is monotone in `x` for `Z_K > 0`). By
`tv_restrict_eq_dropped_mass` this bounds `TV(p, p_K)`. -/
theorem dropped_mass_le_witness {β : Type} (E : ExpLaws α) (s u : β → α) (drop : β → Bool)
    (L : List β) (hK : ∃ t ∈ L, drop t = false) (hu : ∀ t ∈ L, drop t = true → s t ≤ u t) :
    droppedMass (softmax E s L) drop L ≤
      droppedMass (fun t => E.exp (u t)) drop L /
        (keptMass (fun t => E.exp (s t)) drop L + droppedMass (fun t => E.exp (u t)) drop L) := by
  rw [dropped_mass_softmax_eq]
  exact frac_mono (kept_exp_pos E s drop L hK)
    (dropped_nonneg (fun t => E.exp (s t)) drop L (fun t _ => Std.le_of_lt (E.exp_pos (s t))))
    (dropped_exp_le E s u drop L hu)

set_option linter.unusedSectionVars false in
private theorem cond_one_mul_nonneg {γ : Type} (E : ExpLaws α) (u : γ → α)
    (c : Bool) (b : γ) : (0 : α) ≤ cond c 1 0 * E.exp (u b) := by
  have := E.exp_pos (u b)
  cases c with
  | false => simp only [cond_false]; grind
  | true => simp only [cond_true]; grind

set_option linter.unusedSectionVars false in
private theorem token_le_blocks {β γ : Type} [DecidableEq γ] (E : ExpLaws α) (u : γ → α)
    (blk : β → γ) (x : β) (B : List γ) (hm : blk x ∈ B) :
    E.exp (u (blk x)) ≤ lsum (fun b => cond (decide (blk x = b)) 1 0 * E.exp (u b)) B := by
  induction B with
  | nil => cases hm
  | cons b bs ih =>
    simp only [lsum]
    have hr : 0 ≤ lsum (fun b => cond (decide (blk x = b)) 1 0 * E.exp (u b)) bs :=
      lsum_nonneg (fun b _ => cond_one_mul_nonneg E u _ b)
    have hb := cond_one_mul_nonneg E u (decide (blk x = b)) b
    by_cases h : blk x = b
    · rw [decide_eq_true h, cond_true]
      have he : E.exp (u (blk x)) = E.exp (u b) := by rw [h]
      grind
    · have hm' : blk x ∈ bs := by
        rcases List.mem_cons.mp hm with h' | h'
        · exact absurd h' h
        · exact h'
      have := ih hm'
      grind

set_option linter.unusedSectionVars false in
private theorem lsum_add_mul {γ : Type} (f g h : γ → α) (B : List γ) :
    lsum (fun b => (f b + g b) * h b) B =
      lsum (fun b => f b * h b) B + lsum (fun b => g b * h b) B := by
  induction B with
  | nil => simp only [lsum]; grind
  | cons x xs ih => simp only [lsum, ih]; grind

set_option linter.unusedSectionVars false in
/-- Block witnesses of evicted blocks: give every dropped token `t` the witness `u_{blk t}` of
its block (e.g. from the block's centroid and radius); if each dropped token's block is listed,
`blk t ∈ B`, the dropped witness mass is at most the per-block one,
`U_D = Σ_{t dropped} exp u_{blk t} ≤ Σ_{b ∈ B} n_b exp u_b`, with `n_b` the number of dropped
tokens of block `b` (`blockCount`). A block listed twice is counted twice (equality holds when
each block is listed once; only the inequality is proved here). -/
theorem witness_mass_le_blocks {β γ : Type} [DecidableEq γ] (E : ExpLaws α) (u : γ → α)
    (blk : β → γ) (drop : β → Bool) (L : List β) (B : List γ)
    (hB : ∀ t ∈ L, drop t = true → blk t ∈ B) :
    droppedMass (fun t => E.exp (u (blk t))) drop L ≤
      lsum (fun b => blockCount drop blk L b * E.exp (u b)) B := by
  induction L with
  | nil =>
    simp only [droppedMass, blockCount, lsum]
    exact lsum_nonneg (fun b _ => by
      show (0 : α) ≤ 0 * E.exp (u b)
      grind)
  | cons x xs ih =>
    have ih' := ih (fun t ht hd => hB t (by simp [ht]) hd)
    simp only [droppedMass, blockCount, lsum] at ih' ⊢
    rw [lsum_add_mul]
    cases hd : drop x with
    | false =>
      simp only [cond_false, Bool.false_and]
      have h0 : 0 ≤ lsum (fun b => (0 : α) * E.exp (u b)) B :=
        lsum_nonneg (fun b _ => by
          show (0 : α) ≤ 0 * E.exp (u b)
          grind)
      grind
    | true =>
      simp only [cond_true, Bool.true_and]
      have := token_le_blocks E u blk x B (hB x (by simp) hd)
      grind

set_option linter.unusedSectionVars false in
/-- The eviction bound from block witnesses: with some token kept, every dropped token in a
listed evicted block (`blk t ∈ B`) and its logit at most its block's witness, `s_t ≤ u_{blk t}`,
the dropped mass of `p = softmax s` is at most `U / (Z_K + U)` with
`U = Σ_{b ∈ B} n_b exp u_b`. From `dropped_mass_le_witness` and `witness_mass_le_blocks`. -/
theorem dropped_mass_le_blocks {β γ : Type} [DecidableEq γ] (E : ExpLaws α) (s : β → α)
    (u : γ → α) (blk : β → γ) (drop : β → Bool) (L : List β) (B : List γ)
    (hK : ∃ t ∈ L, drop t = false) (hu : ∀ t ∈ L, drop t = true → s t ≤ u (blk t))
    (hB : ∀ t ∈ L, drop t = true → blk t ∈ B) :
    droppedMass (softmax E s L) drop L ≤
      lsum (fun b => blockCount drop blk L b * E.exp (u b)) B /
        (keptMass (fun t => E.exp (s t)) drop L +
          lsum (fun b => blockCount drop blk L b * E.exp (u b)) B) := by
  have h2 : droppedMass (softmax E s L) drop L ≤
      droppedMass (fun t => E.exp (u (blk t))) drop L /
        (keptMass (fun t => E.exp (s t)) drop L +
          droppedMass (fun t => E.exp (u (blk t))) drop L) :=
    dropped_mass_le_witness E s (fun t => u (blk t)) drop L hK hu
  have h3 := frac_mono (kept_exp_pos E s drop L hK)
    (dropped_nonneg (fun t => E.exp (u (blk t))) drop L
      (fun t _ => Std.le_of_lt (E.exp_pos (u (blk t)))))
    (witness_mass_le_blocks E u blk drop L B hB)
  grind

/-! ### Attention over the kept keys -/

set_option linter.unusedSectionVars false in
private theorem kept_div {β : Type} (w : β → α) (Z : α) (drop : β → Bool) (L : List β) :
    keptMass (fun t => w t / Z) drop L = keptMass w drop L / Z := by
  induction L with
  | nil => simp only [keptMass, lsum]; grind
  | cons x xs ih =>
    simp only [keptMass, lsum] at ih ⊢
    cases hd : drop x with
    | false => simp only [cond_false]; grind
    | true => simp only [cond_true]; grind

set_option linter.unusedSectionVars false in
private theorem lsum_filter_kept {β : Type} (w : β → α) (drop : β → Bool) (L : List β) :
    lsum w (L.filter (fun t => !drop t)) = keptMass w drop L := by
  induction L with
  | nil => simp [keptMass, lsum]
  | cons x xs ih =>
    simp only [keptMass] at ih ⊢
    cases hd : drop x with
    | false => simp [hd, lsum, ih]
    | true => simp [hd, lsum, ih]; grind

set_option linter.unusedSectionVars false in
private theorem div_div_div_cancel {e Z K : α} (hZ : 0 < Z) (hK : 0 < K) :
    e / Z / (K / Z) = e / K := by
  have hr : 0 < K / Z := div_pos_of_pos hK hZ
  have hA := mul_div_cancel_pos (z := e / Z) hr
  have hB : K / Z * (e / K) = e / Z := by grind
  have h1 := le_of_mul_le_mul_left_pos hr
    (show K / Z * (e / Z / (K / Z)) ≤ K / Z * (e / K) by grind)
  have h2 := le_of_mul_le_mul_left_pos hr
    (show K / Z * (e / K) ≤ K / Z * (e / Z / (K / Z)) by grind)
  grind

set_option linter.unusedSectionVars false in
/-- Attention over the kept keys is the renormalized restriction: if some token of `L` is kept,
then at every kept token `t` the restriction of `p = softmax s` to the kept tokens,
renormalized, is the softmax of the same logits over the kept tokens alone,
`p_K(t) = softmax s (L kept) t = exp s_t / Z_K`. -/
theorem restrict_softmax_eq {β : Type} (E : ExpLaws α) (s : β → α) (drop : β → Bool)
    (L : List β) (hK : ∃ t ∈ L, drop t = false) (t : β) (ht : drop t = false) :
    restrict (softmax E s L) drop L t = softmax E s (L.filter (fun t => !drop t)) t := by
  have hZK := kept_exp_pos E s drop L hK
  have hD := dropped_nonneg (fun t => E.exp (s t)) drop L
    (fun t _ => Std.le_of_lt (E.exp_pos (s t)))
  have hs := mass_split (fun t => E.exp (s t)) drop L
  have hZ : 0 < lsum (fun t => E.exp (s t)) L := by grind
  have hk : keptMass (softmax E s L) drop L =
      keptMass (fun t => E.exp (s t)) drop L / lsum (fun t => E.exp (s t)) L :=
    kept_div (fun t => E.exp (s t)) (lsum (fun t => E.exp (s t)) L) drop L
  have hf : lsum (fun t => E.exp (s t)) (L.filter (fun t => !drop t)) =
      keptMass (fun t => E.exp (s t)) drop L :=
    lsum_filter_kept (fun t => E.exp (s t)) drop L
  have e1 : restrict (softmax E s L) drop L t =
      E.exp (s t) / lsum (fun t => E.exp (s t)) L / keptMass (softmax E s L) drop L := by
    unfold restrict
    rw [ht, cond_false]
    rfl
  have e2 : softmax E s (L.filter (fun t => !drop t)) t =
      E.exp (s t) / lsum (fun t => E.exp (s t)) (L.filter (fun t => !drop t)) := rfl
  rw [e1, e2, hk, hf]
  exact div_div_div_cancel hZ hZK

set_option linter.unusedSectionVars false in
/-- Eviction in total variation, as the engine computes it: if some token of `L` is kept, the
softmax of the logits `s` over the whole list and the softmax over the kept tokens alone
(`0` at the dropped ones) are at distance
`TV(softmax s, softmax s (L kept)) = p(D) = Z_D / (Z_K + Z_D)`. From
`restrict_softmax_eq`, `tv_restrict_eq_dropped_mass` and `dropped_mass_softmax_eq`. -/
theorem tv_softmax_kept_eq {β : Type} (E : ExpLaws α) (s : β → α) (drop : β → Bool)
    (L : List β) (hK : ∃ t ∈ L, drop t = false) :
    tv (softmax E s L) (fun t => cond (drop t) 0 (softmax E s (L.filter (fun t => !drop t)) t))
        L =
      droppedMass (fun t => E.exp (s t)) drop L /
        (keptMass (fun t => E.exp (s t)) drop L + droppedMass (fun t => E.exp (s t)) drop L) := by
  have hZK := kept_exp_pos E s drop L hK
  have hD := dropped_nonneg (fun t => E.exp (s t)) drop L
    (fun t _ => Std.le_of_lt (E.exp_pos (s t)))
  have hs := mass_split (fun t => E.exp (s t)) drop L
  have hZ : 0 < lsum (fun t => E.exp (s t)) L := by grind
  have hfun : (fun t => cond (drop t) 0 (softmax E s (L.filter (fun t => !drop t)) t)) =
      restrict (softmax E s L) drop L := by
    funext t
    cases hd : drop t with
    | true => simp only [restrict, hd, cond_true]
    | false =>
      simp only [cond_false]
      exact (restrict_softmax_eq E s drop L hK t hd).symm
  have hp : ∀ t ∈ L, 0 ≤ softmax E s L t :=
    fun t _ => Std.le_of_lt (div_pos_of_pos (E.exp_pos (s t)) hZ)
  have hl : lsum (softmax E s L) L =
      lsum (fun t => E.exp (s t)) L / lsum (fun t => E.exp (s t)) L :=
    lsum_div (fun t => E.exp (s t)) (lsum (fun t => E.exp (s t)) L) L
  have h1 : lsum (softmax E s L) L = 1 := by rw [hl]; grind
  have hk : keptMass (softmax E s L) drop L =
      keptMass (fun t => E.exp (s t)) drop L / lsum (fun t => E.exp (s t)) L :=
    kept_div (fun t => E.exp (s t)) (lsum (fun t => E.exp (s t)) L) drop L
  have hKp : 0 < keptMass (softmax E s L) drop L := by
    rw [hk]
    exact div_pos_of_pos hZK hZ
  rw [hfun, tv_restrict_eq_dropped_mass (softmax E s L) drop L hp h1 hKp,
    dropped_mass_softmax_eq]

set_option linter.unusedSectionVars false in
private theorem div_nonneg_of_nonneg {a b : α} (ha : 0 ≤ a) (hb : 0 ≤ b) : 0 ≤ a / b := by
  by_cases h : b = 0
  · subst h
    first | grind | (rw [Lean.Grind.Field.div_zero]; grind)
  · have hb' : 0 < b := by grind
    have := Lean.Grind.OrderedRing.mul_nonneg ha (Std.le_of_lt (inv_pos_of_pos hb'))
    grind

set_option linter.unusedSectionVars false in
private theorem div_self_le_one {x : α} (hx : 0 ≤ x) : x / x ≤ 1 := by
  by_cases h : x = 0
  · subst h
    first | grind | (rw [Lean.Grind.Field.div_zero]; grind)
  · have : 0 < x := by grind
    grind

set_option linter.unusedSectionVars false in
/-- The kept attention is at total variation at most `1` from the full attention, whatever the
two logit vectors `z`, `z'` and the dropped tokens: on a nonempty list `softmax z` sums to `1`
and the softmax of `z'` over the kept tokens (`0` at the dropped ones) sums to at most `1`
(`0` when every token is dropped). The soundness field of the contract
`WitCert.Semantic.evictTV`. -/
theorem tv_kept_le_one {β : Type} (E : ExpLaws α) (z z' : β → α) (drop : β → Bool)
    (L : List β) (hL : L ≠ []) :
    tv (softmax E z L) (fun t => cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t))
      L ≤ 1 := by
  have hZ : 0 < lsum (fun t => E.exp (z t)) L := lsum_pos hL (fun t _ => E.exp_pos (z t))
  have hZk : 0 ≤ lsum (fun t => E.exp (z' t)) (L.filter (fun t => !drop t)) :=
    lsum_nonneg (fun t _ => Std.le_of_lt (E.exp_pos (z' t)))
  have hq : ∀ t ∈ L, 0 ≤ cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t) := by
    intro t _
    cases drop t with
    | true => simp only [cond_true]; grind
    | false =>
      simp only [cond_false]
      exact div_nonneg_of_nonneg (Std.le_of_lt (E.exp_pos (z' t))) hZk
  have hp : ∀ t ∈ L, 0 ≤ softmax E z L t :=
    fun t _ => Std.le_of_lt (div_pos_of_pos (E.exp_pos (z t)) hZ)
  have hl : lsum (softmax E z L) L =
      lsum (fun t => E.exp (z t)) L / lsum (fun t => E.exp (z t)) L :=
    lsum_div (fun t => E.exp (z t)) (lsum (fun t => E.exp (z t)) L) L
  have h1 : lsum (softmax E z L) L = 1 := by rw [hl]; grind
  have hk : lsum (fun t => cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t)) L =
      keptMass (fun t => E.exp (z' t)) drop L /
        lsum (fun t => E.exp (z' t)) (L.filter (fun t => !drop t)) :=
    kept_div (fun t => E.exp (z' t)) (lsum (fun t => E.exp (z' t)) (L.filter (fun t => !drop t)))
      drop L
  have hsum : lsum (fun t => cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t)) L ≤
      1 := by
    rw [hk, ← lsum_filter_kept (fun t => E.exp (z' t)) drop L]
    exact div_self_le_one hZk
  have hle : lsum (fun t => absA (softmax E z L t -
        cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t))) L ≤
      lsum (fun t => softmax E z L t +
        cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t)) L := by
    apply lsum_le
    intro t ht
    have ha := hp t ht
    have hb := hq t ht
    unfold absA
    split <;> grind
  have hadd : lsum (fun t => softmax E z L t +
        cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t)) L =
      lsum (softmax E z L) L +
        lsum (fun t => cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t)) L :=
    lsum_add (softmax E z L)
      (fun t => cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t)) L
  have e2 : tv (softmax E z L)
      (fun t => cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t)) L =
      (1 / 2) * lsum (fun t => absA (softmax E z L t -
        cond (drop t) 0 (softmax E z' (L.filter (fun t => !drop t)) t))) L := rfl
  rw [e2]
  grind

/-! ### Eviction with compressed kept keys -/

set_option linter.unusedSectionVars false in
private theorem absA_sub_le (a b c : α) : absA (a - c) ≤ absA (a - b) + absA (b - c) := by
  unfold absA
  split <;> split <;> split <;> grind

set_option linter.unusedSectionVars false in
/-- The triangle inequality of the total variation: `TV(p, r) ≤ TV(p, q) + TV(q, r)` for any
weight vectors `p`, `q`, `r` over the tokens of `L` (no hypothesis of nonnegativity or of total
mass is needed: it holds token by token for `|p_t − r_t|`). -/
theorem tv_triangle {β : Type} (p q r : β → α) (L : List β) :
    tv p r L ≤ tv p q L + tv q r L := by
  have h : lsum (fun t => absA (p t - r t)) L ≤
      lsum (fun t => absA (p t - q t) + absA (q t - r t)) L :=
    lsum_le (fun t _ => absA_sub_le (p t) (q t) (r t))
  rw [lsum_add] at h
  show (1 / 2 : α) * lsum (fun t => absA (p t - r t)) L ≤
    (1 / 2) * lsum (fun t => absA (p t - q t)) L + (1 / 2) * lsum (fun t => absA (q t - r t)) L
  grind

set_option linter.unusedSectionVars false in
private theorem lsum_abs_cond_filter {β : Type} (f g : β → α) (drop : β → Bool) (L : List β) :
    lsum (fun t => absA (cond (drop t) 0 (f t) - cond (drop t) 0 (g t))) L =
      lsum (fun t => absA (f t - g t)) (L.filter (fun t => !drop t)) := by
  induction L with
  | nil => simp only [List.filter_nil, lsum]
  | cons x xs ih =>
    cases hd : drop x with
    | false =>
      rw [List.filter_cons_of_pos (by simp [hd])]
      simp only [lsum, hd, cond_false]
      rw [ih]
    | true =>
      rw [List.filter_cons_of_neg (by simp [hd])]
      simp only [lsum, hd, cond_true]
      rw [ih]
      have h0 : absA ((0 : α) - 0) = 0 := by unfold absA; split <;> grind
      rw [h0]
      grind

set_option linter.unusedSectionVars false in
/-- Two weight vectors that vanish at the dropped tokens are as far apart over `L` as their
values are over the kept tokens alone: `TV(f·[t kept], g·[t kept]) over L = TV(f, g) over
L kept` (`L kept = L.filter (fun t => !drop t)`). -/
theorem tv_cond_drop_eq_tv_filter {β : Type} (f g : β → α) (drop : β → Bool) (L : List β) :
    tv (fun t => cond (drop t) 0 (f t)) (fun t => cond (drop t) 0 (g t)) L =
      tv f g (L.filter (fun t => !drop t)) := by
  unfold tv
  rw [lsum_abs_cond_filter]

set_option linter.unusedSectionVars false in
/-- Eviction combined with compression of the kept keys: if some token of `L` is kept and the
engine serves the softmax of perturbed logits `s'` (e.g. from quantized kept keys) over the kept
tokens alone (`0` at the dropped ones), its distance to the exact attention `softmax s` over the
whole list is at most the dropped mass plus the compression error over the kept keys,
`TV(softmax s, softmax s' (L kept)) ≤ p(D) + TV(softmax s (L kept), softmax s' (L kept))`.
The second term is the distance that a softmax bridge or meter bounds on the kept keys alone.
From `tv_triangle`, `tv_softmax_kept_eq` and `tv_cond_drop_eq_tv_filter`. -/
theorem evict_quant_tv_le {β : Type} (E : ExpLaws α) (s s' : β → α) (drop : β → Bool)
    (L : List β) (hK : ∃ t ∈ L, drop t = false) :
    tv (softmax E s L) (fun t => cond (drop t) 0 (softmax E s' (L.filter (fun t => !drop t)) t))
        L ≤
      droppedMass (softmax E s L) drop L +
        tv (softmax E s (L.filter (fun t => !drop t)))
          (softmax E s' (L.filter (fun t => !drop t))) (L.filter (fun t => !drop t)) := by
  have h := tv_triangle (softmax E s L)
    (fun t => cond (drop t) 0 (softmax E s (L.filter (fun t => !drop t)) t))
    (fun t => cond (drop t) 0 (softmax E s' (L.filter (fun t => !drop t)) t)) L
  rw [tv_softmax_kept_eq E s drop L hK, ← dropped_mass_softmax_eq E s drop L,
    tv_cond_drop_eq_tv_filter (softmax E s (L.filter (fun t => !drop t)))
      (softmax E s' (L.filter (fun t => !drop t))) drop L] at h
  exact h

set_option linter.unusedSectionVars false in
/-- Eviction from block witnesses combined with compression of the kept keys: with some token
kept, every dropped token in a listed evicted block (`blk t ∈ B`) and its exact logit at most
its block's witness, `s_t ≤ u_{blk t}`, the served attention (the softmax of the perturbed
logits `s'` over the kept tokens) is at total variation at most
`U / (Z_K + U) + TV(softmax s (L kept), softmax s' (L kept))` from `softmax s`, with
`U = Σ_{b ∈ B} n_b exp u_b`. From `evict_quant_tv_le` and `dropped_mass_le_blocks`. -/
theorem evict_quant_tv_le_blocks {β γ : Type} [DecidableEq γ] (E : ExpLaws α) (s s' : β → α)
    (u : γ → α) (blk : β → γ) (drop : β → Bool) (L : List β) (B : List γ)
    (hK : ∃ t ∈ L, drop t = false) (hu : ∀ t ∈ L, drop t = true → s t ≤ u (blk t))
    (hB : ∀ t ∈ L, drop t = true → blk t ∈ B) :
    tv (softmax E s L) (fun t => cond (drop t) 0 (softmax E s' (L.filter (fun t => !drop t)) t))
        L ≤
      lsum (fun b => blockCount drop blk L b * E.exp (u b)) B /
          (keptMass (fun t => E.exp (s t)) drop L +
            lsum (fun b => blockCount drop blk L b * E.exp (u b)) B) +
        tv (softmax E s (L.filter (fun t => !drop t)))
          (softmax E s' (L.filter (fun t => !drop t))) (L.filter (fun t => !drop t)) := by
  have h1 := evict_quant_tv_le E s s' drop L hK
  have h2 := dropped_mass_le_blocks E s u blk drop L B hK hu hB
  grind

/-! ### Restoring evicted blocks -/

set_option linter.unusedSectionVars false in
/-- `x / (a + x)` is antitone in `a > 0` for `x ≥ 0`. -/
private theorem frac_anti {a b x : α} (ha : 0 < a) (hab : a ≤ b) (hx : 0 ≤ x) :
    x / (b + x) ≤ x / (a + x) := by
  have hd1 : 0 < a + x := by grind
  have hd2 : 0 < b + x := by grind
  have hc := Lean.Grind.OrderedRing.mul_pos hd1 hd2
  have hm := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hab hx
  have e1 := mul_div_cancel_pos (z := x) hd1
  have e2 := mul_div_cancel_pos (z := x) hd2
  have f1 : (a + x) * (b + x) * (x / (b + x)) = x * (a + x) := by
    rw [show (a + x) * (b + x) * (x / (b + x)) = (a + x) * ((b + x) * (x / (b + x))) by grind,
      e2]
    grind
  have f2 : (a + x) * (b + x) * (x / (a + x)) = x * (b + x) := by
    rw [show (a + x) * (b + x) * (x / (a + x)) = (b + x) * ((a + x) * (x / (a + x))) by grind,
      e1]
    grind
  apply le_of_mul_le_mul_left_pos hc
  rw [f1, f2]
  grind

set_option linter.unusedSectionVars false in
/-- The algebraic core of the restore step: the eviction bound `x / (Z + x)` grows with the
witness mass `x ≥ 0` and shrinks as the kept mass `Z > 0` grows, so for `0 < Z ≤ Z'` and
`0 ≤ x ≤ x'`, `x / (Z' + x) ≤ x' / (Z + x')`. -/
theorem div_add_le_div_add {Z Z' x x' : α} (hZ : 0 < Z) (hZZ : Z ≤ Z') (hx : 0 ≤ x)
    (hxx : x ≤ x') : x / (Z' + x) ≤ x' / (Z + x') :=
  Std.le_trans (frac_anti hZ hZZ hx) (frac_mono hZ hx hxx)

set_option linter.unusedSectionVars false in
private theorem cond_and_le_of_imp {c c' d : Bool} (h : c' = true → c = true) :
    cond (c' && d) (1 : α) 0 ≤ cond (c && d) 1 0 := by
  cases c' with
  | true => rw [h rfl]; exact Std.le_refl _
  | false =>
    cases c <;> cases d <;>
      simp only [Bool.false_and, Bool.true_and, cond_false, cond_true] <;> grind

set_option linter.unusedSectionVars false in
private theorem cond_zero_le_of_imp {c c' : Bool} {x : α} (hx : 0 ≤ x)
    (h : c' = true → c = true) : cond c 0 x ≤ cond c' 0 x := by
  cases c' with
  | true =>
    rw [h rfl]
    exact Std.le_refl _
  | false =>
    cases c with
    | true => simp only [cond_true, cond_false]; exact hx
    | false => exact Std.le_refl _

set_option linter.unusedSectionVars false in
/-- Dropping fewer tokens (`drop' t → drop t`) counts fewer dropped tokens in each block. -/
private theorem block_count_le_of_imp {β γ : Type} [DecidableEq γ] (drop drop' : β → Bool)
    (blk : β → γ) (L : List β) (b : γ) (h : ∀ t ∈ L, drop' t = true → drop t = true) :
    blockCount (α := α) drop' blk L b ≤ blockCount drop blk L b := by
  unfold blockCount
  exact lsum_le (fun t ht => cond_and_le_of_imp (h t ht))

set_option linter.unusedSectionVars false in
/-- Dropping fewer tokens (`drop' t → drop t`) keeps at least as much nonnegative mass. -/
private theorem kept_mass_le_of_imp {β : Type} (p : β → α) (drop drop' : β → Bool)
    (L : List β) (hp : ∀ t ∈ L, 0 ≤ p t) (h : ∀ t ∈ L, drop' t = true → drop t = true) :
    keptMass p drop L ≤ keptMass p drop' L := by
  unfold keptMass
  exact lsum_le (fun t ht => cond_zero_le_of_imp (hp t ht) (h t ht))

set_option linter.unusedSectionVars false in
private theorem block_count_nonneg {β γ : Type} [DecidableEq γ] (drop : β → Bool)
    (blk : β → γ) (L : List β) (b : γ) : (0 : α) ≤ blockCount drop blk L b := by
  unfold blockCount
  refine lsum_nonneg (fun t _ => ?_)
  cases drop t && decide (blk t = b) with
  | true => simp only [cond_true]; grind
  | false => simp only [cond_false]; grind

set_option linter.unusedSectionVars false in
/-- Restoring evicted tokens never raises the block-witness bound: if some token of `L` is kept
and the restored cache drops a subset of the tokens (`drop' t → drop t`), the bound
`U / (Z_K + U)` of `dropped_mass_le_blocks` (`U = Σ_{b ∈ B} n_b exp u_b`) computed for `drop'`
is at most the one computed for `drop`: `U` does not grow (fewer dropped tokens per block) and
`Z_K = Σ_{t kept} exp s_t` does not shrink. The witnesses and the block list that certified
`drop` still certify `drop'`. From `div_add_le_div_add`. -/
theorem restore_bound_le {β γ : Type} [DecidableEq γ] (E : ExpLaws α) (s : β → α)
    (u : γ → α) (blk : β → γ) (drop drop' : β → Bool) (L : List β) (B : List γ)
    (hK : ∃ t ∈ L, drop t = false) (h : ∀ t ∈ L, drop' t = true → drop t = true) :
    lsum (fun b => blockCount drop' blk L b * E.exp (u b)) B /
        (keptMass (fun t => E.exp (s t)) drop' L +
          lsum (fun b => blockCount drop' blk L b * E.exp (u b)) B) ≤
      lsum (fun b => blockCount drop blk L b * E.exp (u b)) B /
        (keptMass (fun t => E.exp (s t)) drop L +
          lsum (fun b => blockCount drop blk L b * E.exp (u b)) B) := by
  apply div_add_le_div_add (kept_exp_pos E s drop L hK)
  · exact kept_mass_le_of_imp (fun t => E.exp (s t)) drop drop' L
      (fun t _ => Std.le_of_lt (E.exp_pos (s t))) h
  · exact lsum_nonneg (fun b _ => Lean.Grind.OrderedRing.mul_nonneg
      (block_count_nonneg drop' blk L b) (Std.le_of_lt (E.exp_pos (u b))))
  · exact lsum_le (fun b _ => Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right
      (block_count_le_of_imp drop drop' blk L b h) (Std.le_of_lt (E.exp_pos (u b))))

set_option linter.unusedSectionVars false in
/-- The greedy restore step of an eviction gate does not raise the block-witness bound: with
some token of `L` kept, restoring the evicted block `b₀` (its tokens are kept again,
`drop' t = drop t && !(blk t = b₀)`) gives a bound `U' / (Z_K' + U')` at most the bound
`U / (Z_K + U)` before the step (`U = Σ_{b ∈ B} n_b exp u_b`, `Z_K = Σ_{t kept} exp s_t`).
No hypothesis on the witnesses is needed; by `dropped_mass_le_blocks` both bounds are sound
under the witnesses of `drop`. From `restore_bound_le`. -/
theorem restore_block_bound_le {β γ : Type} [DecidableEq γ] (E : ExpLaws α) (s : β → α)
    (u : γ → α) (blk : β → γ) (drop : β → Bool) (L : List β) (B : List γ) (b₀ : γ)
    (hK : ∃ t ∈ L, drop t = false) :
    lsum (fun b => blockCount (fun t => drop t && !decide (blk t = b₀)) blk L b *
          E.exp (u b)) B /
        (keptMass (fun t => E.exp (s t)) (fun t => drop t && !decide (blk t = b₀)) L +
          lsum (fun b => blockCount (fun t => drop t && !decide (blk t = b₀)) blk L b *
            E.exp (u b)) B) ≤
      lsum (fun b => blockCount drop blk L b * E.exp (u b)) B /
        (keptMass (fun t => E.exp (s t)) drop L +
          lsum (fun b => blockCount drop blk L b * E.exp (u b)) B) :=
  restore_bound_le E s u blk drop (fun t => drop t && !decide (blk t = b₀)) L B hK
    (fun t _ h => by simp only [Bool.and_eq_true] at h; exact h.1)

/-! ### The output error of eviction -/

section Vector

variable {V : Type} (N : NormedLaws α V)

set_option linter.unusedSectionVars false in
private theorem add_add_add_comm (a b c d : V) :
    N.add (N.add a b) (N.add c d) = N.add (N.add a c) (N.add b d) := by
  rw [N.add_assoc a b (N.add c d), ← N.add_assoc b c d, N.add_comm b c, N.add_assoc c b d,
    ← N.add_assoc a c (N.add b d)]

set_option linter.unusedSectionVars false in
private theorem vsum_add {β : Type} (f g : β → V) (L : List β) :
    N.vsum (fun t => N.add (f t) (g t)) L = N.add (N.vsum f L) (N.vsum g L) := by
  induction L with
  | nil => simp only [NormedLaws.vsum]; rw [N.zero_add]
  | cons x xs ih =>
    simp only [NormedLaws.vsum]
    rw [ih]
    exact add_add_add_comm N _ _ _ _

set_option linter.unusedSectionVars false in
private theorem smul_vsum {β : Type} (c : α) (f : β → V) (L : List β) :
    N.smul c (N.vsum f L) = N.vsum (fun t => N.smul c (f t)) L := by
  induction L with
  | nil => simp only [NormedLaws.vsum]; exact N.smul_zero c
  | cons x xs ih =>
    simp only [NormedLaws.vsum]
    rw [N.smul_add, ih]

set_option linter.unusedSectionVars false in
private theorem vsum_congr {β : Type} {f g : β → V} {L : List β} (h : ∀ t ∈ L, f t = g t) :
    N.vsum f L = N.vsum g L := by
  induction L with
  | nil => rfl
  | cons x xs ih =>
    simp only [NormedLaws.vsum]
    rw [h x (by simp), ih (fun t ht => h t (by simp [ht]))]

set_option linter.unusedSectionVars false in
private theorem sub_smul_same (a b : α) (x : V) :
    N.sub (N.smul a x) (N.smul b x) = N.smul (a - b) x := by
  rw [N.smul_sub_smul, N.sub_eq_add_neg x x, N.add_neg, N.smul_zero, N.add_zero]

set_option linter.unusedSectionVars false in
/-- The output error of eviction: let `o = Σ_t p_t • v_t` be the attention output over the full
cache and `o_K = Σ_t p_K(t) • v_t` the output over the kept keys (`p_K = restrict p drop L`),
for a distribution `p` (`p_t ≥ 0`, `Σ_t p_t = 1`) with `p(K) > 0` and values in a normed space
`N` whose scalar multiplication satisfies `(a b) • x = a • (b • x)`. If every dropped value has
`‖v_t‖ ≤ M`, then `‖o − o_K‖ ≤ p(D) · (M + ‖o_K‖)`: indeed
`o − o_K = Σ_{t dropped} p_t • v_t − p(D) • o_K`. -/
theorem output_evict_error_le {β : Type}
    (hmul : ∀ (a b : α) (x : V), N.smul (a * b) x = N.smul a (N.smul b x))
    (p : β → α) (v : β → V) (drop : β → Bool) (L : List β) (M : α)
    (hp : ∀ t ∈ L, 0 ≤ p t) (h1 : lsum p L = 1) (hK : 0 < keptMass p drop L)
    (hM : ∀ t ∈ L, drop t = true → N.norm (v t) ≤ M) :
    N.norm (N.sub (N.vsum (fun t => N.smul (p t) (v t)) L)
        (N.vsum (fun t => N.smul (restrict p drop L t) (v t)) L)) ≤
      droppedMass p drop L *
        (M + N.norm (N.vsum (fun t => N.smul (restrict p drop L t) (v t)) L)) := by
  have hs := mass_split p drop L
  have hD : droppedMass p drop L = 1 - keptMass p drop L := by grind
  have hDn := dropped_nonneg p drop L hp
  -- the per-token split `p_t − p_K(t) = [t dropped] p_t − p(D) p_K(t)`
  have hsplit : ∀ t ∈ L, N.sub (N.smul (p t) (v t)) (N.smul (restrict p drop L t) (v t)) =
      N.add (N.smul (cond (drop t) (p t) 0) (v t))
        (N.smul (-(droppedMass p drop L)) (N.smul (restrict p drop L t) (v t))) := by
    intro t _
    have e : p t - restrict p drop L t =
        cond (drop t) (p t) 0 + (-(droppedMass p drop L)) * restrict p drop L t := by
      unfold restrict
      rw [hD]
      cases drop t with
      | false => simp only [cond_false]; grind
      | true => simp only [cond_true]; grind
    rw [sub_smul_same, ← hmul, ← N.add_smul, e]
  rw [N.vsum_sub, vsum_congr N hsplit, vsum_add, ← smul_vsum]
  have n1 := N.norm_add_le (N.vsum (fun t => N.smul (cond (drop t) (p t) 0) (v t)) L)
    (N.smul (-(droppedMass p drop L))
      (N.vsum (fun t => N.smul (restrict p drop L t) (v t)) L))
  have habs : absA (-(droppedMass p drop L)) = droppedMass p drop L := by
    unfold absA; split <;> grind
  rw [N.norm_smul, habs] at n1
  have n2 : N.norm (N.vsum (fun t => N.smul (cond (drop t) (p t) 0) (v t)) L) ≤
      lsum (fun t => N.norm (N.smul (cond (drop t) (p t) 0) (v t))) L :=
    N.norm_vsum_le _ L
  have n3 : lsum (fun t => N.norm (N.smul (cond (drop t) (p t) 0) (v t))) L ≤
      lsum (fun t => M * cond (drop t) (p t) 0) L := by
    apply lsum_le
    intro t ht
    rw [N.norm_smul]
    have hpt := hp t ht
    cases hd : drop t with
    | false =>
      simp only [cond_false]
      have hz : absA (0 : α) = 0 := absA_self_of_nonneg (by grind)
      rw [hz]
      grind
    | true =>
      simp only [cond_true]
      rw [absA_self_of_nonneg hpt]
      have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (hM t ht hd) hpt
      grind
  have n4 : lsum (fun t => M * cond (drop t) (p t) 0) L = M * droppedMass p drop L :=
    lsum_mul_left M (fun t => cond (drop t) (p t) 0) L
  grind

end Vector

end WitCert.Eviction

end
