/-
Formal companion of `witcert_calculus.ledger`.
-/
module

public section

/-!
# Request-level risk ledger

The failure budget of one request and the anytime-valid drift sentinel, over exact rationals.

## Main definitions

* `WitCert.Ledger.rsum`: the sum of `f x` over a list, by structural recursion.
* `WitCert.Ledger.telescopeDelta`: the allowance `δ / ((i+1)(i+2))` of the `i`-th probabilistic
  event (0-based), the Python `telescoping_delta(i, delta_req)`.
* `WitCert.Ledger.telescopeSum`, `WitCert.Ledger.spent`: the allowances summed over the first
  `n` probabilistic events, without and with the factor `δ`.
* `WitCert.Ledger.EventKind`, `WitCert.Ledger.charge`: a stream of admitted certificates and what
  the ledger charges for it.
* `WitCert.Ledger.hitProb`: on the finite tree of draws unfolded from a state, the probability that
  a process reaches a threshold at some node.

## Main statements

* `WitCert.Ledger.telescope_sum_eq`: `Σ_{i<n} 1/((i+1)(i+2)) = 1 − 1/(n+1)`.
* `WitCert.Ledger.spent_eq`: the spend after `n` probabilistic events is `δ (1 − 1/(n+1))`.
* `WitCert.Ledger.telescope_partial_lt`: every partial spend is `< δ` when `δ > 0`.
* `WitCert.Ledger.two_layer_budget`: deterministic certificates cost `0`; the charge of a stream is
  the telescoping spend of its probabilistic events alone.
* `WitCert.Ledger.entry_fallback_sound`, `WitCert.Ledger.entry_fallback_max_sound`: entries that
  fall back to exact bytes cost nothing; the step bound aggregates the kept entries.
* `WitCert.Ledger.ville_finite_tree`: Ville's inequality for a nonnegative supermartingale on a
  finite tree of rational-probability draws.

## Implementation notes

Everything is over `Rat`; nothing is assumed. The tree of draws is given by a kernel
`K : S → List (Rat × S)` (the branches of a state, each with its probability) and unfolded to a
finite depth `n`; taking `S` to be the type of histories makes this the general finite tree.
The kernel need not sum to one: Ville's inequality holds for any sub-probability kernel.
-/

namespace WitCert.Ledger

/-- The sum of `f x` over the list `L`. -/
@[expose] def rsum {β : Type} (f : β → Rat) : List β → Rat
  | [] => 0
  | x :: xs => f x + rsum f xs

/-- A constant factor leaves a sum. -/
theorem rsum_mul_left {β : Type} (c : Rat) (f : β → Rat) (L : List β) :
    rsum (fun x => c * f x) L = c * rsum f L := by
  induction L with
  | nil => simp only [rsum]; grind
  | cons x xs ih => simp only [rsum, ih]; grind

/-- A sum is monotone in its summand. -/
theorem rsum_le {β : Type} (f g : β → Rat) (L : List β) (h : ∀ x ∈ L, f x ≤ g x) :
    rsum f L ≤ rsum g L := by
  induction L with
  | nil => simp only [rsum]; grind
  | cons x xs ih =>
    simp only [rsum]
    have h1 := h x (by simp)
    have h2 := ih (fun y hy => h y (by simp [hy]))
    grind

/-- The allowance of the `i`-th probabilistic event (0-based): `δ / ((i+1)(i+2))`.
Python: `telescoping_delta(i, delta_req)`. -/
@[expose] def telescopeDelta (δ : Rat) (i : Nat) : Rat :=
  δ / (((i : Rat) + 1) * ((i : Rat) + 2))

/-- `Σ_{i<n} 1/((i+1)(i+2))`. -/
@[expose] def telescopeSum : Nat → Rat
  | 0 => 0
  | n + 1 => telescopeSum n + 1 / (((n : Rat) + 1) * ((n : Rat) + 2))

/-- The budget spent after `n` probabilistic events: `Σ_{i<n} telescopeDelta δ i`. -/
@[expose] def spent (δ : Rat) : Nat → Rat
  | 0 => 0
  | n + 1 => spent δ n + telescopeDelta δ n

/-- The telescoping sum in closed form: `Σ_{i<n} 1/((i+1)(i+2)) = 1 − 1/(n+1)`. -/
theorem telescope_sum_eq (n : Nat) : telescopeSum n = 1 - 1 / ((n : Rat) + 1) := by
  induction n with
  | zero => decide +kernel
  | succ n ih =>
    simp only [telescopeSum, ih]
    have h1 : (0 : Rat) < (n : Rat) + 1 := by grind
    have h2 : ((n + 1 : Nat) : Rat) = (n : Rat) + 1 := by simp
    rw [h2]
    grind

/-- The spend is `δ` times the telescoping sum. -/
theorem spent_eq_mul (δ : Rat) (n : Nat) : spent δ n = δ * telescopeSum n := by
  induction n with
  | zero => simp only [spent, telescopeSum]; grind
  | succ n ih =>
    simp only [spent, telescopeSum, ih, telescopeDelta]
    have h1 : (0 : Rat) < (n : Rat) + 1 := by grind
    grind

/-- The spend after `n` probabilistic events: `δ (1 − 1/(n+1))`. -/
theorem spent_eq (δ : Rat) (n : Nat) : spent δ n = δ * (1 - 1 / ((n : Rat) + 1)) := by
  rw [spent_eq_mul, telescope_sum_eq]

/-- The inverse of a positive rational is positive. -/
theorem inv_pos_of_pos {x : Rat} (h : 0 < x) : 0 < x⁻¹ := by
  have h1 : x * x⁻¹ = 1 := by grind
  rcases Std.le_total (a := x⁻¹) (b := 0) with h2 | h2
  · have := Lean.Grind.OrderedRing.mul_nonpos_of_nonneg_of_nonpos (Std.le_of_lt h) h2
    grind
  · grind

/-- Every partial spend stays strictly below the request budget `δ > 0`, at any length. -/
theorem telescope_partial_lt {δ : Rat} (hδ : 0 < δ) (n : Nat) : spent δ n < δ := by
  rw [spent_eq]
  have h1 : (0 : Rat) < (n : Rat) + 1 := by grind
  have h2 := inv_pos_of_pos h1
  have h3 := Lean.Grind.OrderedRing.mul_pos hδ h2
  grind

/-- The kind of a certificate admitted into a request's account. (Empirical readings never enter
the ledger, so they have no kind here.) -/
inductive EventKind where
  /-- A deterministic certificate: it fails with probability `0`. -/
  | deterministic
  /-- A probabilistic certificate: it draws the next telescoping allowance. -/
  | probabilistic
  deriving DecidableEq

/-- What the ledger charges for a stream of admitted events, when `i` probabilistic events have
already been charged: deterministic events cost `0` and do not advance the counter; a
probabilistic one costs `telescopeDelta δ i` and advances it. -/
@[expose] def charge (δ : Rat) : Nat → List EventKind → Rat
  | _, [] => 0
  | i, .deterministic :: es => charge δ i es
  | i, .probabilistic :: es => telescopeDelta δ i + charge δ (i + 1) es

/-- The number of probabilistic events in a stream. -/
@[expose] def probCount : List EventKind → Nat
  | [] => 0
  | .deterministic :: es => probCount es
  | .probabilistic :: es => probCount es + 1

/-- A deterministic event costs nothing. -/
theorem charge_deterministic (δ : Rat) (i : Nat) (es : List EventKind) :
    charge δ i (.deterministic :: es) = charge δ i es := rfl

/-- The charge from counter `i` on is the increment of the telescoping spend. -/
theorem charge_eq (δ : Rat) (i : Nat) (es : List EventKind) :
    charge δ i es = spent δ (i + probCount es) - spent δ i := by
  induction es generalizing i with
  | nil => simp only [charge, probCount]; grind
  | cons e es ih =>
    cases e with
    | deterministic => simp only [charge, probCount, ih]
    | probabilistic =>
      simp only [charge, probCount, ih (i + 1)]
      have h1 : i + (probCount es + 1) = i + 1 + probCount es := by omega
      have h2 : spent δ (i + 1) = spent δ i + telescopeDelta δ i := rfl
      rw [h1, h2]
      grind

/-- Two-layer budget: deterministic certificates cost `0`, so the charge of any stream of events
is the telescoping spend of its probabilistic events alone, `δ (1 − 1/(k+1))` for `k` of them. -/
theorem two_layer_budget (δ : Rat) (es : List EventKind) :
    charge δ 0 es = δ * (1 - 1 / ((probCount es : Rat) + 1)) := by
  rw [charge_eq, Nat.zero_add, spent_eq]
  simp only [spent]
  grind

/-- Whatever the stream, a request never exceeds its budget `δ > 0`. -/
theorem charge_lt {δ : Rat} (hδ : 0 < δ) (es : List EventKind) : charge δ 0 es < δ := by
  rw [charge_eq, Nat.zero_add]
  have := telescope_partial_lt hδ (probCount es)
  simp only [spent]
  grind

/-- On the tree of depth `n` unfolded from state `s` by the kernel `K`, the probability that the
process `M` reaches the threshold `c` at some node (the root included). -/
@[expose] def hitProb {S : Type} (K : S → List (Rat × S)) (M : S → Rat) (c : Rat) :
    Nat → S → Rat
  | 0, s => if c ≤ M s then 1 else 0
  | n + 1, s => if c ≤ M s then 1 else rsum (fun b => b.1 * hitProb K M c n b.2) (K s)

/-- A value at the threshold `1/δ` is at least `1` after scaling by `δ`. -/
theorem one_le_mul_of_inv_le {δ m : Rat} (hδ : 0 < δ) (h : 1 / δ ≤ m) : 1 ≤ δ * m := by
  have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h (Std.le_of_lt hδ)
  grind

/-- Ville's inequality on a finite tree of rational-probability draws: for a nonnegative
supermartingale `M` (each state's expected next value is at most its value) and `δ > 0`,
`P(sup_{t ≤ n} M_t ≥ 1/δ) ≤ δ · M_0`. Python: the `EProcess` alarm rule
`log M_t ≥ ln(1/δ_e)`. -/
theorem ville_finite_tree {S : Type} (K : S → List (Rat × S)) (M : S → Rat) {δ : Rat}
    (hδ : 0 < δ) (hM : ∀ s, 0 ≤ M s) (hK : ∀ s, ∀ b ∈ K s, 0 ≤ b.1)
    (hsup : ∀ s, rsum (fun b => b.1 * M b.2) (K s) ≤ M s) (n : Nat) (s : S) :
    hitProb K M (1 / δ) n s ≤ δ * M s := by
  induction n generalizing s with
  | zero =>
    simp only [hitProb]
    split
    · next h => exact one_le_mul_of_inv_le hδ h
    · have := Lean.Grind.OrderedRing.mul_nonneg (Std.le_of_lt hδ) (hM s)
      grind
  | succ n ih =>
    simp only [hitProb]
    split
    · next h => exact one_le_mul_of_inv_le hδ h
    · have h1 : rsum (fun b => b.1 * hitProb K M (1 / δ) n b.2) (K s) ≤
          rsum (fun b => δ * (b.1 * M b.2)) (K s) := by
        apply rsum_le
        intro b hb
        have h2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (ih b.2) (hK s b hb)
        grind
      rw [rsum_mul_left] at h1
      have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (hsup s) (Std.le_of_lt hδ)
      grind

/-- Entry-level certification with local fallback (Python `certify_entries`, sum aggregate):
each entry is `(kept, error, bound)`; an entry that falls back is restored to exact bytes and
carries no error, and every kept entry's error is at most its bound, so the step's total error
is at most the sum of the kept entries' bounds -- one bad entry costs that entry, not the step. -/
theorem entry_fallback_sound (l : List (Bool × Rat × Rat))
    (hfall : ∀ x ∈ l, x.1 = false → x.2.1 = 0)
    (hkeep : ∀ x ∈ l, x.1 = true → x.2.1 ≤ x.2.2) :
    (l.map fun x => x.2.1).sum ≤ (l.map fun x => if x.1 then x.2.2 else 0).sum := by
  induction l with
  | nil => simp only [List.map_nil, List.sum_nil] <;> grind
  | cons x l ih =>
    simp only [List.map_cons, List.sum_cons]
    have ih' := ih (fun y hy => hfall y (List.mem_cons_of_mem x hy))
      (fun y hy => hkeep y (List.mem_cons_of_mem x hy))
    cases hx : x.1 with
    | false =>
      have := hfall x List.mem_cons_self hx
      simp only [Bool.false_eq_true, ↓reduceIte]
      grind
    | true =>
      have := hkeep x List.mem_cons_self hx
      simp only [↓reduceIte]
      grind

/-- The same with the max aggregate (sup-norm metrics): if every kept bound is at most `M`,
every entry's error is at most `M`, since fallback entries carry none. -/
theorem entry_fallback_max_sound (l : List (Bool × Rat × Rat)) {M : Rat} (hM : 0 ≤ M)
    (hfall : ∀ x ∈ l, x.1 = false → x.2.1 = 0)
    (hkeep : ∀ x ∈ l, x.1 = true → x.2.1 ≤ x.2.2)
    (hb : ∀ x ∈ l, x.1 = true → x.2.2 ≤ M) :
    ∀ x ∈ l, x.2.1 ≤ M := by
  intro x hx
  cases h : x.1 with
  | false => have := hfall x hx h; grind
  | true => have := hkeep x hx h; have := hb x hx h; grind

end WitCert.Ledger

end
