/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

@[expose] public section

/-!
# The sampling sentinel's miss probability over a finite sample space

Formal companion of the modelling step of `witcert_calculus.meters.sentinels.sentinel_rounds` and
`witcert_calculus.meters.sentinels.sentinel_miss_probability`. One round of the sentinel draws `r`
slots uniformly and independently *with replacement* out of `M` slots, `B` of which are bad,
and uses `q = (1 − B/M)^r` (Python: `mp.power(mp.mpf(m - b) / m, r)`) as the probability that
the round misses every bad slot. This file proves that formula over the finite sample space of
the round: the `M^r` equally likely draw sequences.

## Main definitions

* `WitCert.Sampling.draws`: the sample space of `r` draws with replacement from the slots
  `0, …, M − 1`, as the list of all `M^r` draw sequences.
* `WitCert.Sampling.avoids`: a draw sequence misses every bad slot.
* `WitCert.Sampling.badCount`: the number `B` of bad slots among `0, …, M − 1`.
* `WitCert.Sampling.missProb`: the fraction of draw sequences that miss every bad slot, i.e. the
  miss probability of one round under uniform independent draws.

## Main statements

* `WitCert.Sampling.length_draws`: the sample space has `M^r` elements.
* `WitCert.Sampling.count_draws`, `WitCert.Sampling.mem_draws`: every sequence of `r` slots
  below `M` appears exactly once, and nothing else appears.
* `WitCert.Sampling.countP_avoids_draws`: `(M − B)^r` draw sequences miss the bad slots.
* `WitCert.Sampling.miss_probability_eq`: the miss probability is `((M − B)/M)^r`, the Python
  formula.
* `WitCert.Sampling.miss_probability_eq_one_sub`: the same as `(1 − B/M)^r`.

## Implementation notes

The set of bad slots is a predicate `bad : Nat → Bool`; only its values on `0, …, M − 1`
matter, and `B = badCount M bad` counts them, so `B ≤ M` holds by construction
(`badCount_le`). A finite set `S` of slots is `fun i => decide (i ∈ S)`. Uniform independent
draws with replacement make the `M^r` sequences of `draws M r` equally likely, so a probability
is a count divided by `M^r` (`missProb`); that the generator used by the Python code is uniform
and independent is the modelling assumption left outside Lean. The definitions are
`noncomputable`: they are meant for proofs, not evaluation.
-/

namespace WitCert.Sampling

/-- The sample space of `r` draws with replacement from the slots `0, …, M − 1`: every list of
length `r` over `List.range M`, the first draw first. -/
noncomputable def draws (M : Nat) : Nat → List (List Nat)
  | 0 => [[]]
  | r + 1 => (List.range M).flatMap fun i => (draws M r).map fun s => i :: s

/-- One more draw: prepend each slot to each shorter sequence. -/
theorem draws_succ (M r : Nat) :
    draws M (r + 1) = (List.range M).flatMap fun i => (draws M r).map fun s => i :: s := rfl

/-- Prepending each element of `L` to each list of `D` gives `|L| · |D|` lists. -/
theorem length_flatMap_map_cons (L : List Nat) (D : List (List Nat)) :
    (L.flatMap fun i => D.map fun s => i :: s).length = L.length * D.length := by
  induction L with
  | nil => simp
  | cons i L ih =>
    rw [List.flatMap_cons, List.length_append, List.length_map, ih, List.length_cons]
    grind

/-- The sample space of `r` draws from `M` slots has `M^r` elements. -/
theorem length_draws (M r : Nat) : (draws M r).length = M ^ r := by
  induction r with
  | zero => rfl
  | succ r ih =>
    rw [draws_succ, length_flatMap_map_cons, List.length_range, ih, Nat.pow_succ, Nat.mul_comm]

/-- Prepending `i` to each list of `D`: `j :: u` occurs as often as `u` in `D` if `i = j`, and
not at all otherwise. -/
theorem count_map_cons (D : List (List Nat)) (i j : Nat) (u : List Nat) :
    (D.map fun s => i :: s).count (j :: u) = if i = j then D.count u else 0 := by
  induction D with
  | nil => simp
  | cons s D ih =>
    simp only [List.map_cons, List.count_cons, ih]
    by_cases h : i = j <;> by_cases h' : s = u <;> simp [h, h']

/-- Prepending each element of `L` to each list of `D`: `j :: u` occurs
`count j L · count u D` times. -/
theorem count_flatMap_map_cons (L : List Nat) (D : List (List Nat)) (j : Nat) (u : List Nat) :
    (L.flatMap fun i => D.map fun s => i :: s).count (j :: u) = L.count j * D.count u := by
  induction L with
  | nil => simp
  | cons i L ih =>
    rw [List.flatMap_cons, List.count_append, ih, List.count_cons, count_map_cons]
    by_cases h : i = j <;> simp [h] <;> grind

/-- Each draw sequence appears once: a list `s` occurs in `draws M r` exactly once if it has
length `r` and all its slots are below `M`, and not at all otherwise. -/
theorem count_draws (M r : Nat) (s : List Nat) :
    (draws M r).count s = if s.length = r ∧ s.all (· < M) = true then 1 else 0 := by
  induction r generalizing s with
  | zero =>
    cases s with
    | nil => simp [draws]
    | cons j u => simp [draws]
  | succ r ih =>
    cases s with
    | nil =>
      have h0 : (draws M (r + 1)).count [] = 0 := by
        rw [List.count_eq_zero, draws_succ]
        simp
      rw [h0]
      simp
    | cons j u =>
      rw [draws_succ, count_flatMap_map_cons, List.count_range, ih u]
      by_cases hj : j < M <;> by_cases hu : u.length = r <;> simp [hj, hu]

/-- The elements of the sample space are exactly the sequences of `r` slots below `M`. -/
theorem mem_draws (M r : Nat) (s : List Nat) :
    s ∈ draws M r ↔ s.length = r ∧ ∀ i ∈ s, i < M := by
  rw [← List.count_pos_iff, count_draws]
  constructor
  · intro h
    by_cases hc : s.length = r ∧ s.all (· < M) = true
    · simpa using hc
    · rw [if_neg hc] at h
      omega
  · intro h
    have hc : s.length = r ∧ s.all (· < M) = true := by simpa using h
    rw [if_pos hc]
    omega

/-- The draw sequence `s` misses every bad slot. -/
noncomputable def avoids (bad : Nat → Bool) (s : List Nat) : Bool := s.all fun i => !bad i

/-- The number `B` of bad slots among the slots `0, …, M − 1`. -/
noncomputable def badCount (M : Nat) (bad : Nat → Bool) : Nat := (List.range M).countP bad

/-- There are at most `M` bad slots. -/
theorem badCount_le (M : Nat) (bad : Nat → Bool) : badCount M bad ≤ M := by
  have h := List.countP_le_length (p := bad) (l := List.range M)
  rw [List.length_range] at h
  exact h

/-- `M − B` of the slots `0, …, M − 1` are good. -/
theorem countP_not_range (M : Nat) (bad : Nat → Bool) :
    (List.range M).countP (fun i => !bad i) = M - badCount M bad := by
  have h := List.length_eq_countP_add_countP bad (l := List.range M)
  have e : (fun a => decide ¬bad a = true) = fun i => !bad i := by
    funext a
    cases bad a <;> rfl
  rw [e, List.length_range] at h
  unfold badCount
  omega

/-- Prepending each element of `L` to each list of `D`: the lists missing the bad slots are the
good heads times the lists of `D` missing them. -/
theorem countP_flatMap_map_cons (L : List Nat) (D : List (List Nat)) (bad : Nat → Bool) :
    (L.flatMap fun i => D.map fun s => i :: s).countP (avoids bad) =
      L.countP (fun i => !bad i) * D.countP (avoids bad) := by
  induction L with
  | nil => simp
  | cons i L ih =>
    rw [List.flatMap_cons, List.countP_append, ih, List.countP_map, List.countP_cons]
    cases h : bad i
    · have e : (avoids bad ∘ fun s => i :: s) = avoids bad := by
        funext s
        simp [avoids, h]
      rw [e]
      simp only [Bool.not_false]
      grind
    · have e : (avoids bad ∘ fun s => i :: s) = fun _ => false := by
        funext s
        simp [avoids, h]
      rw [e]
      simp

/-- `(M − B)^r` of the `M^r` draw sequences miss every bad slot. -/
theorem countP_avoids_draws (M r : Nat) (bad : Nat → Bool) :
    (draws M r).countP (avoids bad) = (M - badCount M bad) ^ r := by
  induction r with
  | zero => simp [draws, avoids]
  | succ r ih =>
    rw [draws_succ, countP_flatMap_map_cons, countP_not_range, ih, Nat.pow_succ, Nat.mul_comm]

/-- Powers of a nonzero rational are nonzero. -/
theorem rat_pow_ne_zero {b : Rat} (hb : b ≠ 0) : ∀ r : Nat, b ^ r ≠ 0
  | 0 => by simp
  | r + 1 => by
    have ih := rat_pow_ne_zero hb r
    rw [Rat.pow_succ]
    grind

/-- `(a/b)^r = a^r / b^r` in `Rat`, for `b ≠ 0`. -/
theorem rat_div_pow (a b : Rat) (hb : b ≠ 0) : ∀ r : Nat, (a / b) ^ r = a ^ r / b ^ r
  | 0 => by first | (simp; done) | (simp; decide) | (simp; grind) | (simp; rfl)
  | r + 1 => by
    have ih := rat_div_pow a b hb r
    have hbr := rat_pow_ne_zero hb r
    rw [Rat.pow_succ, Rat.pow_succ, Rat.pow_succ, ih]
    grind

/-- The miss probability of one round: the fraction of the `M^r` equally likely draw sequences
(`r` uniform independent draws with replacement from `M` slots) that miss every bad slot. -/
noncomputable def missProb (M r : Nat) (bad : Nat → Bool) : Rat :=
  ((draws M r).countP (avoids bad) : Rat) / ((draws M r).length : Rat)

/-- The sentinel's miss probability, in the form of the Python code
(`mp.power(mp.mpf(m - b) / m, r)`): for `0 < M` slots with `B = badCount M bad ≤ M` bad ones,
`r` uniform independent draws with replacement all miss the bad slots with probability
`((M − B)/M)^r`. -/
theorem miss_probability_eq (M r : Nat) (bad : Nat → Bool) (hM : 0 < M) :
    missProb M r bad = (((M - badCount M bad : Nat) : Rat) / (M : Rat)) ^ r := by
  unfold missProb
  rw [countP_avoids_draws, length_draws, Rat.natCast_pow, Rat.natCast_pow]
  have hM' : (M : Rat) ≠ 0 := by
    have := Rat.natCast_pos.mpr hM
    grind
  exact (rat_div_pow _ _ hM' r).symm

/-- The sentinel's miss probability as `q = (1 − B/M)^r` (`WitCert.Meters.sentinel_rounds_sound`
takes this `q`). -/
theorem miss_probability_eq_one_sub (M r : Nat) (bad : Nat → Bool) (hM : 0 < M) :
    missProb M r bad = (1 - (badCount M bad : Rat) / (M : Rat)) ^ r := by
  rw [miss_probability_eq M r bad hM]
  have hB := badCount_le M bad
  have hM' : (M : Rat) ≠ 0 := by
    have := Rat.natCast_pos.mpr hM
    grind
  have e : (M : Rat) = ((M - badCount M bad : Nat) : Rat) + (badCount M bad : Rat) := by
    rw [← Rat.natCast_add, Nat.sub_add_cancel hB]
  have e2 : ((M - badCount M bad : Nat) : Rat) / (M : Rat) =
      1 - (badCount M bad : Rat) / (M : Rat) := by
    grind
  rw [e2]

end WitCert.Sampling

end
