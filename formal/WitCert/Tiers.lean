/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

/-!
# Tiers: how strong a number is

Mirror of `witcert_calculus.tiers`. A tier is decided from evidence, never asserted.
The order is `saturated < empirical < partiallyCertified < certified` (Python's `IntEnum`
values `0 < 1 < 2 < 3`); composition keeps the weakest tier, the meet of this chain.

## Main definitions

* `WitCert.Tier`, `WitCert.Tier.rank`, the order `≤` on tiers, `WitCert.Tier.weakest`.
* `WitCert.Evidence`: a proof, a restricted proof, or a measurement.
* `WitCert.Tier.decideTier`: the tier of a number from its evidence, value and saturation
  (Python `decide_tier`).

## Main statements

* `WitCert.Tier.weakest_comm`, `weakest_assoc`, `weakest_idem`: `weakest` is a semilattice
  operation.
* `WitCert.Tier.weakest_le_left`, `weakest_le_right`, `le_weakest`: it is the meet.
* `WitCert.Tier.decide_saturated_ne_certified`: a value at or above its metric's saturation is
  never `certified`.
-/

@[expose] public section

namespace WitCert

/-- How strong a number is. Larger is stronger. -/
inductive Tier where
  /-- A sound bound at or above its metric's saturation: true but vacuous. -/
  | saturated
  /-- An observation with no bound behind it. -/
  | empirical
  /-- A proved bound that holds on a stated decidable subset only. -/
  | partiallyCertified
  /-- A proved bound whose premises hold, below saturation. -/
  | certified
  deriving DecidableEq, Repr

/-- What backs a number. -/
inductive Evidence where
  /-- A Lean theorem whose premises were checked. -/
  | proof
  /-- A Lean theorem that holds on a stated decidable subset. -/
  | restricted
  /-- A measurement with no proof behind it. -/
  | measurement
  deriving DecidableEq, Repr

namespace Tier

/-- The strength of a tier as a natural number (Python's `IntEnum` value). -/
def rank : Tier → Nat
  | saturated => 0
  | empirical => 1
  | partiallyCertified => 2
  | certified => 3

/-- Tiers are ordered by strength. -/
instance : LE Tier := ⟨fun x y => x.rank ≤ y.rank⟩

instance (x y : Tier) : Decidable (x ≤ y) := inferInstanceAs (Decidable (x.rank ≤ y.rank))

/-- The weakest of two tiers (the meet); composition keeps it. -/
def weakest (x y : Tier) : Tier := if x.rank ≤ y.rank then x else y

/-- `weakest` is commutative. -/
theorem weakest_comm (x y : Tier) : weakest x y = weakest y x := by
  cases x <;> cases y <;> rfl

/-- `weakest` is associative. -/
theorem weakest_assoc (x y z : Tier) : weakest (weakest x y) z = weakest x (weakest y z) := by
  cases x <;> cases y <;> cases z <;> rfl

/-- `weakest` is idempotent. -/
theorem weakest_idem (x : Tier) : weakest x x = x := by
  cases x <;> rfl

/-- The weakest of two tiers is at most the first. -/
theorem weakest_le_left (x y : Tier) : weakest x y ≤ x := by
  cases x <;> cases y <;> decide

/-- The weakest of two tiers is at most the second. -/
theorem weakest_le_right (x y : Tier) : weakest x y ≤ y := by
  cases x <;> cases y <;> decide

/-- A lower bound of two tiers is a lower bound of their weakest: `weakest` is the meet. -/
theorem le_weakest {x y z : Tier} (hx : z ≤ x) (hy : z ≤ y) : z ≤ weakest x y := by
  unfold weakest
  split <;> assumption

/-- `certified` is the top element: a unit of `weakest`. -/
theorem weakest_certified (x : Tier) : weakest x certified = x := by
  cases x <;> rfl

/-- `certified` is a left unit of `weakest`. -/
theorem certified_weakest (x : Tier) : weakest certified x = x := by
  cases x <;> rfl

/-- The tier that evidence gives on its own (Python `_intrinsic`). -/
def ofEvidence : Evidence → Tier
  | .proof => certified
  | .restricted => partiallyCertified
  | .measurement => empirical

/-- The tier of a proved bound that reached saturation: `saturated`; a measurement stays
`empirical`. -/
def ofSaturated : Evidence → Tier
  | .measurement => empirical
  | _ => saturated

/-- The tier of a number from its evidence, its value and its metric's saturation
(Python `decide_tier`): a bound at or above saturation is `saturated`. -/
def decideTier (e : Evidence) : Option Rat → Option Rat → Tier
  | some v, some s => if s ≤ v then ofSaturated e else ofEvidence e
  | _, _ => ofEvidence e

/-- A value at or above its metric's saturation is never `certified`. -/
theorem decide_saturated_ne_certified (e : Evidence) {v s : Rat} (h : s ≤ v) :
    decideTier e (some v) (some s) ≠ certified := by
  simp only [decideTier, if_pos h]
  cases e <;> decide

/-- Below saturation (or without one), a proof gives `certified`. -/
theorem decide_proof_of_lt {v s : Rat} (h : v < s) :
    decideTier .proof (some v) (some s) = certified := by
  simp only [decideTier, if_neg (Rat.not_le.mpr h)]
  rfl

end Tier

end WitCert

end
