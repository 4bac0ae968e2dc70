/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Semantic
public import WitCert.Meters
public import WitCert.Ledger
public import WitCert.Witness
public import WitCert.Formats

/-!
# The meters as statements about semantic contracts

The meters of `WitCert.Meters`, `WitCert.Witness` and `WitCert.Formats` read per-token logit
bounds `c` and report a bound; the ledger of `WitCert.Ledger` hands out failure allowances. This
file restates each of them about the semantic contracts of `WitCert.Semantic`: the statement
names the contract's exact and approximate maps (or its `delta` and failure event) and writes
the meter's bound out. The softmax meters bound the output error of `softmaxTVEform`, the logit meters bound the
logit error of `scoreBridge`, and the telescoping allowances bound the failure probability of a
`Contract.recurrence`; entry-level fallback becomes a contract on a step's entries.

## Main definitions

* `WitCert.Semantic.entryContract`: the contract an entry runs, its metered contract when kept,
  the identity when it falls back.
* `WitCert.Semantic.entrySpace`: entries on a list of coordinates with the summed error
  `Σ_t |x_t − x'_t|`, at any metric; `entryStore`: the stored entries, kept ones stored, the
  others exact.
* `WitCert.Semantic.entryFallback`: entry-level certification with local fallback as a contract
  `e_out ≤ 1 · e_in + Σ_{kept} bound_t`.

## Main statements

* `WitCert.Semantic.tv_eform_meter_sound`, `tv_two_sided_meter_sound`,
  `tv_retention_meter_sound`: the e-form, two-sided and retention meters bound the output error
  `TV(exact z, approx ω z')` of `softmaxTVEform` from per-token logit bounds `c`.
* `WitCert.Semantic.tv_single_token_meter`: on one visible token the output error is `0`.
* `WitCert.Semantic.box_logit_bound_meter_sound`: the per-channel box witness bounds the logit
  error of `scoreBridge` by `sc Σ_c |q_c| w_c`.
* `WitCert.Semantic.logit_bound_meter_sound`: band witnesses (the coordinates cut into bands)
  bound the logit error of `scoreBridge` by `sc Σ_b x_b`;
  `logit_bound_norms_meter_sound`: the same with `x_b = n_b w_b`, as Python computes `c`.
* `WitCert.Semantic.recurrence_delta_le_spent`: a recurrence whose `k`-th step draws at most the
  `k`-th telescoping allowance has at most the telescoping spend as its `delta`;
  `recurrence_delta_le_budget`, `recurrence_prob_bad_lt_budget`: its `delta` and the probability
  of its failure event are `< δ`.
* `WitCert.Semantic.recurrence_delta_eq`: the `delta` of a recurrence is the sum of its steps'.
* `WitCert.Semantic.entry_fallback_meter_sound`, `entry_fallback_prob_bad_le`: entries that fall
  back cost nothing, so the `delta` of a step's composite, and the probability of its failure
  event, are at most the sum of the kept entries' allowances.
* `WitCert.Semantic.entry_fallback_contract_sound`: soundness of `entryFallback`, bound written
  out (the summed error of the stored step is at most `Σ_t |x_t − x'_t| + Σ_{kept} bound_t`).
* Helpers: `scoreBridge_sub` (the logit error of `scoreBridge` is `sc ⟨q, k − k'⟩`),
  `dot_append`, `dot_flatten`, `abs_sub_le_add`, `sum_map_le_add`, `entryStore_le`.

## Implementation notes

* `softmaxTVEform` and `scoreBridge` are deterministic: their failure event is never hit, so the
  meter statements hold at every sample point `ω` (no hypothesis `bad ω = false`, which would go
  unused), and none of them mentions `delta`.
* The meters' bounds are proved from the theorems of `WitCert.Meters`, `WitCert.Witness` and
  `WitCert.Formats` applied to the contract's maps: the exact and the approximate maps of
  `softmaxTVEform` are `softmax z` and `softmax z'`, those of `scoreBridge` are `sc ⟨q, k⟩` and
  `sc ⟨q, k'⟩`.
* The logit error of `scoreBridge` is written `|z − z'|`, not the squared error of its space,
  and the subtraction is written at `Rat` (`@HSub.hSub Rat Rat Rat _`): the carrier of
  `logitSqSpace` is `Rat` only after unfolding.
* The band witness statement takes the bands as lists of coordinates, each with its witness
  `x_b`; the score contract reads the coordinates of all the bands in order.
* The ledger statements are over `Rat` spaces, like `Contract.recurrence`: there the field of
  the contracts is `Rat`, so they read the same whether `delta` is typed `Rat` or by the field.
* A kept entry's store is within its bound at every input (`∀ v, |v − store t v| ≤ bound t`),
  as the storage witness of `WitCert.Semantic.storageWitness` is.
-/

@[expose] public section

namespace WitCert.Semantic

section Field

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-! ### Softmax meters about `softmaxTVEform` -/

/-- The e-form meter as a statement about `softmaxTVEform`: at every sample point, if every
logit error is bounded, `|z_t − z'_t| ≤ c_t`, the output error of the contract is at most
`½ (A² − 1)` with `A = Σ_t p̃_t e^{c_t}`, `p̃ = softmax z'`. From
`WitCert.Meters.tv_eform_sound`. Python: `meters.tv_eform`. -/
theorem tv_eform_meter_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (S : Sample Ω) (s : Site) (ω : Ω) (z z' c : β → α)
    (hc : ∀ t ∈ L, Analytic.absA (z t - z' t) ≤ c t) :
    Analytic.tv ((softmaxTVEform E L hL S s).exact z) ((softmaxTVEform E L hL S s).approx ω z')
        L ≤
      1 / 2 * (Meters.aPlus E z' c L * Meters.aPlus E z' c L - 1) :=
  Meters.tv_eform_sound E z z' c L hL hc

/-- The two-sided meter as a statement about `softmaxTVEform`: under the hypotheses of
`tv_eform_meter_sound`, the output error is at most `½ (A/A⁻ − A⁻/A)` with
`A⁻ = Σ_t p̃_t e^{−c_t}`. From `WitCert.Meters.tv_two_sided_sound`. Python:
`meters.tv_two_sided`. -/
theorem tv_two_sided_meter_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (S : Sample Ω) (s : Site) (ω : Ω) (z z' c : β → α)
    (hc : ∀ t ∈ L, Analytic.absA (z t - z' t) ≤ c t) :
    Analytic.tv ((softmaxTVEform E L hL S s).exact z) ((softmaxTVEform E L hL S s).approx ω z')
        L ≤
      1 / 2 * (Meters.aPlus E z' c L / Meters.aMinus E z' c L -
        Meters.aMinus E z' c L / Meters.aPlus E z' c L) :=
  Meters.tv_two_sided_sound E z z' c L hL hc

/-- The per-token retention meter as a statement about `softmaxTVEform`: under the hypotheses of
`tv_eform_meter_sound`, for per-token weights
`b_t ≥ min(A e^{c_t} − 1, max(e^{c_t}/A⁻ − 1, 1 − e^{−c_t}/A))`, the output error is at most
`½ Σ_t p̃_t b_t`. From `WitCert.Meters.tv_retention_sound`. Python: the retention form in
`meters.tv_meter`. -/
theorem tv_retention_meter_sound {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (S : Sample Ω) (s : Site) (ω : Ω) (z z' c b : β → α)
    (hc : ∀ t ∈ L, Analytic.absA (z t - z' t) ≤ c t)
    (hb : ∀ t ∈ L, Meters.aPlus E z' c L * E.exp (c t) - 1 ≤ b t ∨
      (E.exp (c t) / Meters.aMinus E z' c L - 1 ≤ b t ∧
        1 - E.exp (-(c t)) / Meters.aPlus E z' c L ≤ b t)) :
    Analytic.tv ((softmaxTVEform E L hL S s).exact z) ((softmaxTVEform E L hL S s).approx ω z')
        L ≤
      1 / 2 * Analytic.lsum (fun t => Analytic.softmax E z' L t * b t) L :=
  Meters.tv_retention_sound E z z' c L b hL hc hb

/-- A single visible token, as a statement about `softmaxTVEform`: over `L = [t]` the output
error of the contract is `0` at every sample point, whatever the logits. From
`WitCert.Meters.tv_single_token`. Python: the single-token rows of `tv_forms`. -/
theorem tv_single_token_meter {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (t : β)
    (hL : [t] ≠ []) (S : Sample Ω) (s : Site) (ω : Ω) (z z' : β → α) :
    Analytic.tv ((softmaxTVEform E [t] hL S s).exact z)
      ((softmaxTVEform E [t] hL S s).approx ω z') [t] = 0 :=
  Meters.tv_single_token E z z' t

end Field

/-! ### Logit meters about `scoreBridge` -/

section RatMeters

variable {Ω : Type} {β : Type}

/-- The logit error of `scoreBridge` is `sc ⟨q, k − k'⟩`. -/
theorem scoreBridge_sub (L : List β) (q : β → Rat) (sc : Rat) (S : Sample Ω) (s : Site) (ω : Ω)
    (k k' : β → Rat) :
    @HSub.hSub Rat Rat Rat _ ((scoreBridge L q sc S s).exact k)
        ((scoreBridge L q sc S s).approx ω k') =
      sc * Bridges.dot (L.map fun t => (q t, k t - k' t)) := by
  show sc * Bridges.dot (L.map fun t => (q t, k t)) -
      sc * Bridges.dot (L.map fun t => (q t, k' t)) = _
  rw [← dot_map_sub L q k k']
  grind

/-- The per-channel box meter as a statement about `scoreBridge`: at every sample point, if
every channel of the stored key is within its witness, `|k_t − k'_t| ≤ w_t`, the logit error of
the contract is at most `sc Σ_t |q_t| w_t` (for `sc ≥ 0`). From
`WitCert.Formats.box_logit_bound_sound`. Python: `formats.format_logit_bound`. -/
theorem box_logit_bound_meter_sound (L : List β) (q : β → Rat) (sc : Rat) (S : Sample Ω)
    (s : Site) (ω : Ω) (k k' w : β → Rat)
    (hsc : 0 ≤ sc) (hw : ∀ t ∈ L, Bridges.abs (k t - k' t) ≤ w t) :
    Bridges.abs (@HSub.hSub Rat Rat Rat _ ((scoreBridge L q sc S s).exact k)
        ((scoreBridge L q sc S s).approx ω k')) ≤
      sc * (L.map fun t => Bridges.abs (q t) * w t).sum := by
  have h := Formats.box_logit_bound_sound (L.map fun t => (q t, k t - k' t, w t)) hsc
    (by
      intro e he
      obtain ⟨t, ht, rfl⟩ := List.mem_map.mp he
      exact hw t ht)
  simp only [List.map_map, Function.comp_def] at h
  rw [scoreBridge_sub]
  simp only [Bridges.dot, List.map_map, Function.comp_def]
  exact h

/-- The dot product of a concatenation is the sum of the dot products. -/
theorem dot_append (l₁ l₂ : List (Rat × Rat)) :
    Bridges.dot (l₁ ++ l₂) = Bridges.dot l₁ + Bridges.dot l₂ := by
  induction l₁ with
  | nil => simp only [List.nil_append, Bridges.dot, List.map_nil, List.sum_nil] <;> grind
  | cons p l ih =>
    simp only [Bridges.dot, List.cons_append, List.map_cons, List.sum_cons] at ih ⊢
    grind

/-- The dot product over the coordinates of all the bands is the sum of the bands' dot
products. -/
theorem dot_flatten (B : List (List β × Rat)) (q d : β → Rat) :
    Bridges.dot ((B.map Prod.fst).flatten.map fun t => (q t, d t)) =
      (B.map fun b => Bridges.dot (b.1.map fun t => (q t, d t))).sum := by
  induction B with
  | nil => simp only [List.map_nil, List.flatten_nil, List.sum_nil, Bridges.dot]
  | cons b B ih =>
    simp only [List.map_cons, List.flatten_cons, List.map_append, List.sum_cons, dot_append, ih]

/-- The band-witness meter as a statement about `scoreBridge`: cut the coordinates into bands
`b` (the score contract reads the coordinates of all the bands in order), and let each witness
`x_b ≥ 0` bound the product of the band norms of the query and of the key residual,
`‖q_b‖² ‖k_b − k'_b‖² ≤ x_b²`. At every sample point, for `sc ≥ 0`, the logit error of the
contract at the stored key `k'` is at most the meter's `c = sc Σ_b x_b`. From
`WitCert.Witness.logit_bound_sound`. Python: `witness.logit_bound`. -/
theorem logit_bound_meter_sound (B : List (List β × Rat)) (q : β → Rat) (sc : Rat)
    (S : Sample Ω) (s : Site) (ω : Ω) (k k' : β → Rat)
    (hsc : 0 ≤ sc) (hx : ∀ b ∈ B, 0 ≤ b.2)
    (hb : ∀ b ∈ B, (b.1.map fun t => q t * q t).sum * keyErr b.1 k k' ≤ b.2 * b.2) :
    Bridges.abs (@HSub.hSub Rat Rat Rat _ ((scoreBridge (B.map Prod.fst).flatten q sc S s).exact k)
        ((scoreBridge (B.map Prod.fst).flatten q sc S s).approx ω k')) ≤
      sc * (B.map Prod.snd).sum := by
  have h := Witness.logit_bound_sound (B.map fun b => (b.1.map fun t => (q t, k t - k' t), b.2))
    hsc
    (by
      intro e he
      obtain ⟨b, hbB, rfl⟩ := List.mem_map.mp he
      exact hx b hbB)
    (by
      intro e he
      obtain ⟨b, hbB, rfl⟩ := List.mem_map.mp he
      show Bridges.normSqFst (b.1.map fun t => (q t, k t - k' t)) *
          Bridges.normSqSnd (b.1.map fun t => (q t, k t - k' t)) ≤ b.2 * b.2
      rw [normSqFst_map, normSqSnd_map]
      exact hb b hbB)
  simp only [List.map_map, Function.comp_def] at h
  rw [scoreBridge_sub, dot_flatten]
  exact h

/-- The band-witness meter as Python computes it, about `scoreBridge`: each band `b` carries an
upper bound `n_b ≥ 0` of the query band norm (`‖q_b‖² ≤ n_b²`) and the stored witness `w_b ≥ 0`
of the key residual's band norm (`‖k_b − k'_b‖² ≤ w_b²`). At every sample point, for
`sc ≥ 0`, the logit error of the contract is at most `c = sc Σ_b n_b w_b`. From
`WitCert.Witness.logit_bound_sound_of_norms`. Python: `witness.logit_bound`. -/
theorem logit_bound_norms_meter_sound (B : List (List β × Rat × Rat)) (q : β → Rat) (sc : Rat)
    (S : Sample Ω) (s : Site) (ω : Ω) (k k' : β → Rat)
    (hsc : 0 ≤ sc) (hn : ∀ b ∈ B, 0 ≤ b.2.1) (hw : ∀ b ∈ B, 0 ≤ b.2.2)
    (hq : ∀ b ∈ B, (b.1.map fun t => q t * q t).sum ≤ b.2.1 * b.2.1)
    (hr : ∀ b ∈ B, keyErr b.1 k k' ≤ b.2.2 * b.2.2) :
    Bridges.abs (@HSub.hSub Rat Rat Rat _ ((scoreBridge (B.map Prod.fst).flatten q sc S s).exact k)
        ((scoreBridge (B.map Prod.fst).flatten q sc S s).approx ω k')) ≤
      sc * (B.map fun b => b.2.1 * b.2.2).sum := by
  have h := Witness.logit_bound_sound_of_norms
    (B.map fun b => (b.1.map fun t => (q t, k t - k' t), b.2.1, b.2.2)) hsc
    (by
      intro e he
      obtain ⟨b, hbB, rfl⟩ := List.mem_map.mp he
      exact hn b hbB)
    (by
      intro e he
      obtain ⟨b, hbB, rfl⟩ := List.mem_map.mp he
      exact hw b hbB)
    (by
      intro e he
      obtain ⟨b, hbB, rfl⟩ := List.mem_map.mp he
      show Bridges.normSqFst (b.1.map fun t => (q t, k t - k' t)) ≤ b.2.1 * b.2.1
      rw [normSqFst_map]
      exact hq b hbB)
    (by
      intro e he
      obtain ⟨b, hbB, rfl⟩ := List.mem_map.mp he
      show Bridges.normSqSnd (b.1.map fun t => (q t, k t - k' t)) ≤ b.2.2 * b.2.2
      rw [normSqSnd_map]
      exact hr b hbB)
  simp only [List.map_map, Function.comp_def] at h
  have e := dot_flatten (B.map fun b => (b.1, b.2.1 * b.2.2)) q (fun t => k t - k' t)
  simp only [List.map_map, Function.comp_def] at e
  rw [scoreBridge_sub, e]
  exact h

end RatMeters

/-! ### The telescoping ledger and recurrences -/

section Ledger

variable {Ω : Type} {s : Site} {i : Metric s} {S : Sample Ω} {X : Space Rat i}

/-- A recurrence after `acc` whose `k`-th step has `delta` at most the telescoping allowance of
the `(j + k)`-th probabilistic event has `delta` at most `acc.delta` plus the increment of the
telescoping spend from `j` to `j + |cs|`. The deltas of a recurrence add
(`Contract.comp_delta`). -/
theorem recurrence_delta_le_spent (δ : Rat) (acc : Contract S X X) (cs : List (Contract S X X))
    (j : Nat) (hcs : ∀ k (hk : k < cs.length), cs[k].delta ≤ Ledger.telescopeDelta δ (j + k)) :
    (Contract.recurrence acc cs).delta ≤
      acc.delta + (Ledger.spent δ (j + cs.length) - Ledger.spent δ j) := by
  induction cs generalizing acc j with
  | nil =>
    simp only [Contract.recurrence, List.foldl_nil, List.length_nil, Nat.add_zero]
    grind
  | cons c cs ih =>
    have h0 := hcs 0 (by simp only [List.length_cons]; omega)
    simp only [List.getElem_cons_zero, Nat.add_zero] at h0
    have ih' := ih (c.comp acc) (j + 1) (fun k hk => by
      have h := hcs (k + 1) (by simp only [List.length_cons]; omega)
      simp only [List.getElem_cons_succ] at h
      rw [show j + 1 + k = j + (k + 1) by omega]
      exact h)
    have e1 : Contract.recurrence acc (c :: cs) = Contract.recurrence (c.comp acc) cs := rfl
    have e2 : (c.comp acc).delta = acc.delta + c.delta := rfl
    have e3 : Ledger.spent δ (j + 1) = Ledger.spent δ j + Ledger.telescopeDelta δ j := rfl
    have e4 : j + (c :: cs).length = j + 1 + cs.length := by
      simp only [List.length_cons]
      omega
    rw [e1, e4]
    rw [e2, e3] at ih'
    grind

/-- The ledger's budget bounds a recurrence: if the `k`-th step of a recurrence started from the
identity has `delta` at most the `k`-th telescoping allowance `δ / ((k+1)(k+2))`, the
recurrence's `delta` is `< δ` (for `δ > 0`). From `WitCert.Ledger.telescope_partial_lt`. Python:
`ledger.telescoping_delta`. -/
theorem recurrence_delta_le_budget {δ : Rat} (hδ : 0 < δ) (cs : List (Contract S X X))
    (hcs : ∀ k (hk : k < cs.length), cs[k].delta ≤ Ledger.telescopeDelta δ k) :
    (Contract.recurrence (Contract.id S X) cs).delta < δ := by
  have h := recurrence_delta_le_spent δ (Contract.id S X) cs 0 (fun k hk => by
    rw [Nat.zero_add]
    exact hcs k hk)
  have h1 := Ledger.telescope_partial_lt hδ cs.length
  have e0 : (Contract.id S X).delta = 0 := rfl
  have e1 : Ledger.spent δ 0 = 0 := rfl
  rw [Nat.zero_add, e0, e1] at h
  grind

/-- Under the hypotheses of `recurrence_delta_le_budget`, the failure event of the recurrence has
probability `< δ`: the request stays within its budget. -/
theorem recurrence_prob_bad_lt_budget {δ : Rat} (hδ : 0 < δ) (cs : List (Contract S X X))
    (hcs : ∀ k (hk : k < cs.length), cs[k].delta ≤ Ledger.telescopeDelta δ k) :
    S.prob (Contract.recurrence (Contract.id S X) cs).bad < δ := by
  have h1 := (Contract.recurrence (Contract.id S X) cs).prob_bad
  have h2 := recurrence_delta_le_budget hδ cs hcs
  grind

/-! ### Entry-level fallback -/

/-- The contract an entry runs: its metered contract when it is kept (`e.1 = true`), the identity
(the exact bytes, certain) when it falls back. The third component is the entry's allowance. -/
noncomputable def entryContract (e : Bool × Contract S X X × Rat) : Contract S X X :=
  cond e.1 e.2.1 (Contract.id S X)

/-- The `delta` of a recurrence is the sum of the deltas of its steps, after `acc`'s. -/
theorem recurrence_delta_eq (acc : Contract S X X) (cs : List (Contract S X X)) :
    (Contract.recurrence acc cs).delta = acc.delta + (cs.map fun c => c.delta).sum := by
  induction cs generalizing acc with
  | nil => simp only [Contract.recurrence, List.foldl_nil, List.map_nil, List.sum_nil] <;> grind
  | cons c cs ih =>
    have e1 : Contract.recurrence acc (c :: cs) = Contract.recurrence (c.comp acc) cs := rfl
    have e2 : (c.comp acc).delta = acc.delta + c.delta := rfl
    rw [e1, ih, e2]
    simp only [List.map_cons, List.sum_cons]
    grind

/-- Entry-level fallback as a statement about contracts: the entries of a step run in order, a
kept entry runs its metered contract, whose `delta` is at most the entry's allowance, and an
entry that falls back runs the identity (exact bytes, `delta = 0`). The composite's `delta` is
at most the sum of the kept entries' allowances: an entry that falls back costs nothing. From
`WitCert.Ledger.entry_fallback_sound`. Python: `certify_entries`. -/
theorem entry_fallback_meter_sound (es : List (Bool × Contract S X X × Rat))
    (hkeep : ∀ e ∈ es, e.1 = true → e.2.1.delta ≤ e.2.2) :
    (Contract.recurrence (Contract.id S X) (es.map entryContract)).delta ≤
      (es.map fun e => if e.1 then e.2.2 else 0).sum := by
  have h := Ledger.entry_fallback_sound (es.map fun e => (e.1, (entryContract e).delta, e.2.2))
    (by
      intro x hx hf
      obtain ⟨⟨b, c, w⟩, _, rfl⟩ := List.mem_map.mp hx
      cases b
      · rfl
      · cases hf)
    (by
      intro x hx ht
      obtain ⟨⟨b, c, w⟩, he, rfl⟩ := List.mem_map.mp hx
      cases b
      · cases ht
      · exact hkeep (true, c, w) he rfl)
  simp only [List.map_map, Function.comp_def] at h
  rw [recurrence_delta_eq]
  simp only [List.map_map, Function.comp_def]
  have e0 : (Contract.id S X).delta = 0 := rfl
  rw [e0]
  grind

/-- Under the hypotheses of `entry_fallback_meter_sound`, the failure event of the composite has
probability at most the sum of the kept entries' allowances. -/
theorem entry_fallback_prob_bad_le (es : List (Bool × Contract S X X × Rat))
    (hkeep : ∀ e ∈ es, e.1 = true → e.2.1.delta ≤ e.2.2) :
    S.prob (Contract.recurrence (Contract.id S X) (es.map entryContract)).bad ≤
      (es.map fun e => if e.1 then e.2.2 else 0).sum := by
  have h1 := (Contract.recurrence (Contract.id S X) (es.map entryContract)).prob_bad
  have h2 := entry_fallback_meter_sound es hkeep
  grind

end Ledger

section Entries

variable {Ω : Type} {β : Type}

/-- Entries on the coordinates `L` with the summed error `Σ_t |x_t − x'_t|`, at any metric. -/
noncomputable def entrySpace (L : List β) {s : Site} (m : Metric s) : Space Rat m where
  carrier := β → Rat
  err x x' := (L.map fun t => Bridges.abs (x t - x' t)).sum

/-- The triangle inequality for `WitCert.Bridges.abs`. -/
theorem abs_sub_le_add (x y z : Rat) :
    Bridges.abs (x - z) ≤ Bridges.abs (x - y) + Bridges.abs (y - z) := by
  unfold Bridges.abs
  split <;> split <;> split <;> grind

/-- A sum of terms each at most the sum of two terms is at most the sum of the two sums. -/
theorem sum_map_le_add (L : List β) (f g h : β → Rat) (hf : ∀ t ∈ L, f t ≤ g t + h t) :
    (L.map f).sum ≤ (L.map g).sum + (L.map h).sum := by
  induction L with
  | nil => simp only [List.map_nil, List.sum_nil] <;> grind
  | cons x L ih =>
    simp only [List.map_cons, List.sum_cons]
    have h₁ := hf x (by simp)
    have h₂ := ih (fun t ht => hf t (by simp [ht]))
    grind

/-- The stored entries of a step with local fallback: a kept entry (`keep t = true`) is stored
as `store t v`, an entry that falls back keeps its exact bytes `v`. -/
noncomputable def entryStore (keep : β → Bool) (store : β → Rat → Rat) (x : β → Rat) :
    β → Rat :=
  fun t => cond (keep t) (store t (x t)) (x t)

/-- The stored entries differ from the entries by at most the kept entries' bounds in total,
when every kept entry is stored within its bound. From `WitCert.Ledger.entry_fallback_sound`. -/
theorem entryStore_le (L : List β) (keep : β → Bool) (store : β → Rat → Rat) (bound : β → Rat)
    (hkeep : ∀ t ∈ L, keep t = true → ∀ v, Bridges.abs (v - store t v) ≤ bound t)
    (x : β → Rat) :
    (L.map fun t => Bridges.abs (x t - entryStore keep store x t)).sum ≤
      (L.map fun t => if keep t then bound t else 0).sum := by
  have h := Ledger.entry_fallback_sound
    (L.map fun t => (keep t, Bridges.abs (x t - entryStore keep store x t), bound t))
    (by
      intro e he hf
      obtain ⟨t, _, rfl⟩ := List.mem_map.mp he
      have hk : keep t = false := hf
      show Bridges.abs (x t - entryStore keep store x t) = 0
      unfold entryStore
      rw [hk]
      unfold Bridges.abs
      split <;> grind)
    (by
      intro e he hk
      obtain ⟨t, ht, rfl⟩ := List.mem_map.mp he
      have hk' : keep t = true := hk
      show Bridges.abs (x t - entryStore keep store x t) ≤ bound t
      unfold entryStore
      rw [hk']
      exact hkeep t ht hk' (x t))
  simp only [List.map_map, Function.comp_def] at h
  exact h

/-- Entry-level certification with local fallback as a contract on a step's entries (Python
`certify_entries`, sum aggregate): the approximate map stores the kept entries and restores the
others to exact bytes; every kept entry is stored within its bound. The step's error is at most
`1 · e_in + Σ_{kept} bound_t`: one bad entry costs that entry, not the step. -/
noncomputable def entryFallback (L : List β) (keep : β → Bool) (store : β → Rat → Rat)
    (bound : β → Rat)
    (hkeep : ∀ t ∈ L, keep t = true → ∀ v, Bridges.abs (v - store t v) ≤ bound t)
    (S : Sample Ω) {s : Site} (m : Metric s) : Contract S (entrySpace L m) (entrySpace L m) where
  exact x := x
  approx _ x' := entryStore keep store x'
  a := 1
  b := (L.map fun t => if keep t then bound t else 0).sum
  a_nonneg := by decide
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ x x' _ := by
    have h₁ := sum_map_le_add L (fun t => Bridges.abs (x t - entryStore keep store x' t))
      (fun t => Bridges.abs (x t - x' t)) (fun t => Bridges.abs (x' t - entryStore keep store x' t))
      (fun t _ => abs_sub_le_add (x t) (x' t) (entryStore keep store x' t))
    have h₂ := entryStore_le L keep store bound hkeep x'
    show (L.map fun t => Bridges.abs (x t - entryStore keep store x' t)).sum ≤
      1 * (L.map fun t => Bridges.abs (x t - x' t)).sum +
        (L.map fun t => if keep t then bound t else 0).sum
    grind

/-- Soundness of `entryFallback`, bound written out: outside the failure event, the summed error
of the stored step is at most `1 · Σ_t |x_t − x'_t| + Σ_{kept} bound_t`. -/
theorem entry_fallback_contract_sound (L : List β) (keep : β → Bool) (store : β → Rat → Rat)
    (bound : β → Rat)
    (hkeep : ∀ t ∈ L, keep t = true → ∀ v, Bridges.abs (v - store t v) ≤ bound t)
    (S : Sample Ω) {s : Site} (m : Metric s) (ω : Ω)
    (hω : (entryFallback L keep store bound hkeep S m).bad ω = false) (x x' : β → Rat) :
    (L.map fun t =>
        Bridges.abs (x t - (entryFallback L keep store bound hkeep S m).approx ω x' t)).sum ≤
      1 * (L.map fun t => Bridges.abs (x t - x' t)).sum +
        (L.map fun t => if keep t then bound t else 0).sum :=
  (entryFallback L keep store bound hkeep S m).sound ω hω x x' trivial

end Entries

end WitCert.Semantic

end
