/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Contracts
public import WitCert.Bridges
public import WitCert.Analytic

/-!
# Semantic contracts: maps, error functionals and their proofs

`WitCert.Contract` records the numbers of a contract `e_out ≤ a * e_in + b`; this file gives
them a meaning. A metric becomes an error functional `err exact approx` on a carrier
(`WitCert.Semantic.Space`), still indexed by the `WitCert.Metric` value, so the metric and site
typing of `WitCert.Contract` carries over. A semantic contract carries the exact and the
approximate maps of a stage and the proof that the first stage's error bounds the second's,
except on a failure event of a finite uniform sample space. Composition builds the soundness
proof of the composite from the two soundness proofs; the bridges of `WitCert.Bridges` and
`WitCert.Analytic` become contracts whose soundness fields are those bridge theorems.

## Main definitions

* `WitCert.Semantic.Space α m`: a carrier and an error functional `err : carrier → carrier → α`
  for the metric `m`.
* `WitCert.Semantic.Sample`: a finite uniform sample space (a nonempty list of equally likely
  points); `Sample.count`, `Sample.prob` (valued in an ordered field `α`).
* `WitCert.Semantic.Contract S X Y`: maps `exact`, `approx ω`, coefficients `a b` with
  `0 ≤ a`, a downward-closed domain, a failure event `bad` with `prob bad ≤ delta`, a tier and
  the soundness proof.
* `WitCert.Semantic.Contract.comp`, `WitCert.Semantic.Contract.id`: series composition and the
  identity; `WitCert.Semantic.Contract.erase`: the phantom `WitCert.Contract` of a contract over
  `Rat`.
* `WitCert.Semantic.MonoContract S X Y`: the same with a monotone transfer `e ↦ transfer e` in
  place of `e ↦ a * e + b`; `MonoContract.comp`, `Contract.toMono`.
* Spaces: `keySpace`, `logitSqSpace`, `valueSpace`, `pooledSpace`, `weightSpace` (over `Rat`),
  `logitSpace`, `tvSpace` (over an ordered field), `ratSpace`.
* Bridges: `scoreBridge`, `storageWitness`, `poolingBridge`, `selectionBridge` (over `Rat`),
  `softmaxTVEform`, `softmaxTVAffine` (over an ordered field with an exponential), and the
  chain `storageScore = scoreBridge ∘ storageWitness`.
* `WitCert.Semantic.Contract.recurrence`: step contracts on one state space, composed in order.

## Main statements

* `WitCert.Semantic.Sample.prob_or_le`: the union bound; `Sample.prob_never_le`,
  `Sample.prob_nonneg`.
* `WitCert.Semantic.Contract.comp_sound`, `Contract.id_sound`: the composite and the identity
  are sound, their numbers written out (what the Python composition and identity cite).
* `WitCert.Semantic.Contract.comp_a`, `comp_b`, `comp_delta`, `comp_tier`: the composite's
  numbers are those of `WitCert.Contract.comp`; `erase_comp`: erasing commutes with composition.
* `WitCert.Semantic.Contract.comp_a_assoc`, `comp_b_assoc`, `comp_delta_assoc`,
  `comp_tier_assoc`: associativity of the numbers.
* `WitCert.Semantic.MonoContract.comp_transfer`, `Contract.toMono_comp_transfer`: transfers
  compose as functions, and the affine transfer of a composite is the composite of the transfers.
* `WitCert.Semantic.score_glue`, `pooling_glue`, `storage_glue`, `selection_glue`: the bridge
  theorems in the form of the soundness fields; `storageScore_sound`: the soundness of the
  chain, unfolded.
* `WitCert.Semantic.Contract.recurrence_coeffs`, `recurrence_sound`: a recurrence has the
  coefficients `WitCert.Bridges.recurrenceCoeffs` of `WitCert.Bridges.recurrence_comp_sound`,
  and is sound with them.

## Implementation notes

* The error functional takes the exact point first: `err x x'` is the error of `x'` as an
  approximation of `x`. Nonnegativity is not required; no proof here needs it.
* Randomness: all the stages of a composition share one sample space `S`; a sample point `ω`
  drives every approximate map, and a deterministic stage ignores it (`bad := fun _ => false`,
  `delta := 0`). The composite fails where either stage fails, so `prob` of the composite's
  failure event is at most the sum of the deltas (`Sample.prob_or_le`). Probabilities and deltas
  live in the contract's field `α` (`Sample.prob` casts the counts by the `Nat` cast of
  `Lean.Grind.Semiring`), so a delta may involve the exponential of `α` (the Tier-B delta of
  `WitCert.Semantic.ditherTierB`); over `Rat` they are `Rat`, like the `delta` of
  `WitCert.Contract` (`Contract.erase`).
* A domain is a predicate on the input error, closed downwards: a smaller error stays in it.
  Composition pulls the second domain back along the first stage's bound
  (`e ↦ a₁ e + b₁`, or `transfer₁`), which is monotone, so the pullback is closed downwards too.
* The coefficients live in an ordered field `α` (core's classes, as in `WitCert.Analytic`). The
  bridges of `WitCert.Bridges` are stated over `Rat`, the softmax bridges over any `α` with an
  exponential `E : ExpLaws α` (which has no model over `Rat`), so the chain built here,
  `storageScore`, is over `Rat` and stops at the logits.
* Vectors are functions `β → α` read on a list `L` of coordinates (as in `WitCert.Analytic`);
  the list-of-pairs statements of `WitCert.Bridges` are applied to `L.map fun t => (q t, d t)`.
  The key and logit errors of the score bridge are squared (no square root over `Rat`).
* `erase` forgets the maps, the proof and the domain (the phantom domain is `[]`).
* Definitions are `noncomputable`: they are evaluated by the kernel, never run (see the
  implementation notes of `WitCert.Contracts`).
-/

@[expose] public section

namespace WitCert.Semantic

/-! ### Spaces and sample spaces -/

/-- A metric given meaning: a carrier and an error functional, indexed by the metric `m` (so the
metric and its site stay in the type). `err x x'` is the error of `x'` as an approximation of the
exact `x`. -/
structure Space (α : Type) {s : Site} (m : Metric s) where
  /-- The points compared by the metric. -/
  carrier : Type
  /-- The error of the approximate point (second) against the exact point (first). -/
  err : carrier → carrier → α

/-- A finite uniform sample space: a nonempty list of equally likely points (repetitions
count with their multiplicity). -/
structure Sample (Ω : Type) where
  /-- The sample points. -/
  points : List Ω
  /-- There is at least one point. -/
  nonempty : points ≠ []

namespace Sample

variable {Ω : Type}

/-- The number of sample points in the event `E`. -/
noncomputable def count (S : Sample Ω) (E : Ω → Bool) : Nat := (S.points.filter E).length

/-- Counting the points of a union: at most the sum of the counts. -/
theorem count_or_le (l : List Ω) (E F : Ω → Bool) :
    (l.filter fun ω => E ω || F ω).length ≤ (l.filter E).length + (l.filter F).length := by
  induction l with
  | nil => simp
  | cons x l ih =>
    simp only [List.filter_cons]
    cases hE : E x <;> cases hF : F x <;> simp <;> omega

/-- The never-event has no point. -/
theorem count_never (l : List Ω) : (l.filter fun _ => false).length = 0 := by
  induction l with
  | nil => simp
  | cons x l ih => first | exact ih | simpa [List.filter_cons] using ih | simp

section Prob

variable {α : Type} [Lean.Grind.Field α]

attribute [local instance] Lean.Grind.Semiring.natCast

/-- The probability of the event `E`, in the field `α`: the fraction of sample points in it
(the counts are cast by the `Nat` cast of `Lean.Grind.Semiring`). -/
noncomputable def prob (S : Sample Ω) (E : Ω → Bool) : α :=
  (S.count E : α) / (S.points.length : α)

/-- The cast of a sum of naturals is the sum of the casts. -/
theorem natCast_add (m n : Nat) : ((m + n : Nat) : α) = (m : α) + (n : α) := by
  induction n with
  | zero => rw [Nat.add_zero, Lean.Grind.Semiring.natCast_zero]; grind
  | succ n ih =>
    rw [← Nat.add_assoc, Lean.Grind.Semiring.natCast_succ, Lean.Grind.Semiring.natCast_succ, ih]
    grind

variable [LE α] [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- The cast of a natural is nonnegative. -/
theorem natCast_nonneg (n : Nat) : (0 : α) ≤ (n : α) := by
  induction n with
  | zero => rw [Lean.Grind.Semiring.natCast_zero]; exact Std.le_refl _
  | succ n ih =>
    rw [Lean.Grind.Semiring.natCast_succ]
    have := Lean.Grind.OrderedRing.zero_lt_one (R := α)
    grind

/-- The cast of a positive natural is positive. -/
theorem natCast_pos {n : Nat} (h : 0 < n) : (0 : α) < (n : α) := by
  obtain ⟨k, rfl⟩ : ∃ k, n = k + 1 := ⟨n - 1, by omega⟩
  rw [Lean.Grind.Semiring.natCast_succ]
  have := Lean.Grind.OrderedRing.zero_lt_one (R := α)
  have := natCast_nonneg (α := α) k
  grind

/-- The cast is monotone. -/
theorem natCast_le_natCast {m n : Nat} (h : m ≤ n) : (m : α) ≤ (n : α) := by
  obtain ⟨k, rfl⟩ : ∃ k, n = m + k := ⟨n - m, by omega⟩
  rw [natCast_add]
  have := natCast_nonneg (α := α) k
  grind

/-- The union bound: `prob (E ∪ F) ≤ prob E + prob F`. -/
theorem prob_or_le (S : Sample Ω) (E F : Ω → Bool) :
    S.prob (α := α) (fun ω => E ω || F ω) ≤ S.prob E + S.prob F := by
  have hn : (0 : α) < (S.points.length : α) :=
    natCast_pos (List.length_pos_iff.mpr S.nonempty)
  have hc : ((S.count (fun ω => E ω || F ω) : Nat) : α) ≤
      ((S.count E + S.count F : Nat) : α) :=
    natCast_le_natCast (count_or_le S.points E F)
  rw [natCast_add] at hc
  have h := WitCert.Analytic.div_le_div_of_le hn hc
  unfold prob
  grind

/-- The never-event has probability `0`. -/
theorem prob_never_le (S : Sample Ω) : S.prob (α := α) (fun _ => false) ≤ 0 := by
  have hc : S.count (fun _ => false) = 0 := count_never S.points
  unfold prob
  rw [hc, Lean.Grind.Semiring.natCast_zero]
  grind

/-- Probabilities are nonnegative. -/
theorem prob_nonneg (S : Sample Ω) (E : Ω → Bool) : (0 : α) ≤ S.prob E := by
  have hn : (0 : α) < (S.points.length : α) :=
    natCast_pos (List.length_pos_iff.mpr S.nonempty)
  have h := WitCert.Analytic.div_le_div_of_le hn (natCast_nonneg (α := α) (S.count E))
  unfold prob
  grind

end Prob

end Sample

/-- Both sides of a disjunction of booleans that is `false` are `false`. -/
theorem or_eq_false {p q : Bool} (h : (p || q) = false) : p = false ∧ q = false := by
  cases p <;> cases q <;> simp_all

section Field

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- Transitivity of `≤`. -/
theorem le_trans' {x y z : α} (h₁ : x ≤ y) (h₂ : y ≤ z) : x ≤ z := by grind

/-- An affine map with a nonnegative slope is monotone. -/
theorem affine_mono {a b e e' : α} (ha : 0 ≤ a) (h : e ≤ e') : a * e + b ≤ a * e' + b := by
  have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h ha
  grind

/-- Two affine bounds compose: `m ≤ a₁ e + b₁` and `o ≤ a₂ m + b₂` with `0 ≤ a₂` give
`o ≤ (a₂ a₁) e + (a₂ b₁ + b₂)`. -/
theorem affine_comp_le {e m o a₁ b₁ a₂ b₂ : α} (ha : 0 ≤ a₂) (h₁ : m ≤ a₁ * e + b₁)
    (h₂ : o ≤ a₂ * m + b₂) : o ≤ a₂ * a₁ * e + (a₂ * b₁ + b₂) := by
  have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h₁ ha
  grind

/-- A bound is a bound with a zero offset. -/
theorem le_add_zero {x y : α} (h : x ≤ y) : x ≤ y + 0 := by grind

/-- The identity bound `e ≤ 1 * e + 0`. -/
theorem le_one_mul_add_zero (e : α) : e ≤ 1 * e + 0 := by grind

/-! ### Affine semantic contracts -/

/-- A semantic contract from the space `X` to the space `Y` over the sample space `S`: for every
sample point outside the failure event `bad` and every exact input `x` and approximate input
`x'` whose error lies in the domain, the output error is at most `a * e_in + b`. -/
structure Contract {Ω : Type} {s t : Site} {i : Metric s} {o : Metric t} (S : Sample Ω)
    (X : Space α i) (Y : Space α o) where
  /-- The exact map of the stage. -/
  exact : X.carrier → Y.carrier
  /-- The approximate map of the stage at the sample point `ω`. -/
  approx : Ω → X.carrier → Y.carrier
  /-- Slope. -/
  a : α
  /-- Offset. -/
  b : α
  /-- The slope is nonnegative. -/
  a_nonneg : 0 ≤ a
  /-- Domain of validity, a predicate on the input error. -/
  dom : α → Prop
  /-- The domain is closed downwards. -/
  dom_down : ∀ {e e' : α}, e ≤ e' → dom e' → dom e
  /-- The failure event. -/
  bad : Ω → Bool
  /-- Failure probability. -/
  delta : α
  /-- The failure event has probability at most `delta`. -/
  prob_bad : S.prob (α := α) bad ≤ delta
  /-- Tier, decided from the evidence. -/
  tier : Tier
  /-- Soundness: outside the failure event, on the domain, `e_out ≤ a * e_in + b`. -/
  sound : ∀ ω, bad ω = false → ∀ x x', dom (X.err x x') →
    Y.err (exact x) (approx ω x') ≤ a * X.err x x' + b

namespace Contract

variable {Ω : Type} {S : Sample Ω} {s t u v : Site} {i : Metric s} {m : Metric t}
  {n : Metric u} {o : Metric v} {X : Space α i} {Y : Space α m} {Z : Space α n} {W : Space α o}

/-- Series composition: first `f`, then `g`. Coefficients `(a₂ a₁, a₂ b₁ + b₂)`, the failure
events are united and the deltas add, the tier is the weakest, and `g`'s domain is pulled back
along `f`'s bound. The soundness proof is built from the two soundness proofs. -/
noncomputable def comp (g : Contract S Y Z) (f : Contract S X Y) : Contract S X Z where
  exact x := g.exact (f.exact x)
  approx ω x' := g.approx ω (f.approx ω x')
  a := g.a * f.a
  b := g.a * f.b + g.b
  a_nonneg := Lean.Grind.OrderedRing.mul_nonneg g.a_nonneg f.a_nonneg
  dom e := f.dom e ∧ g.dom (f.a * e + f.b)
  dom_down h hd := ⟨f.dom_down h hd.1, g.dom_down (affine_mono f.a_nonneg h) hd.2⟩
  bad ω := f.bad ω || g.bad ω
  delta := f.delta + g.delta
  prob_bad := by
    have h := S.prob_or_le (α := α) f.bad g.bad
    have h₁ := f.prob_bad
    have h₂ := g.prob_bad
    grind
  tier := Tier.weakest f.tier g.tier
  sound ω hω x x' hd := by
    obtain ⟨hf, hg⟩ := or_eq_false hω
    have h₁ := f.sound ω hf x x' hd.1
    have h₂ := g.sound ω hg _ _ (g.dom_down h₁ hd.2)
    exact affine_comp_le g.a_nonneg h₁ h₂

/-- The identity contract `e_out ≤ 1 * e_in + 0` on one space: certain, on every input. -/
protected noncomputable def id (S : Sample Ω) (X : Space α i) : Contract S X X where
  exact x := x
  approx _ x := x
  a := 1
  b := 0
  a_nonneg := by grind
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ x x' _ := le_one_mul_add_zero (X.err x x')

/-- Slope of a composite: the phantom formula `a₂ a₁`. -/
theorem comp_a (g : Contract S Y Z) (f : Contract S X Y) : (g.comp f).a = g.a * f.a := rfl

/-- Offset of a composite: the phantom formula `a₂ b₁ + b₂`. -/
theorem comp_b (g : Contract S Y Z) (f : Contract S X Y) : (g.comp f).b = g.a * f.b + g.b :=
  rfl

/-- Failure probabilities add under composition (union bound, `Sample.prob_or_le`). -/
theorem comp_delta (g : Contract S Y Z) (f : Contract S X Y) :
    (g.comp f).delta = f.delta + g.delta := rfl

/-- The tier of a composite is the weakest of the tiers of its stages. -/
theorem comp_tier (g : Contract S Y Z) (f : Contract S X Y) :
    (g.comp f).tier = Tier.weakest f.tier g.tier := rfl

/-- The composite fails exactly where one of its stages fails. -/
theorem comp_bad (g : Contract S Y Z) (f : Contract S X Y) (ω : Ω) :
    (g.comp f).bad ω = (f.bad ω || g.bad ω) := rfl

/-- The soundness of a series composite, its numbers written out: outside the union of the two
failure events and on the pulled-back domain, `e_out ≤ (a₂ a₁) e_in + (a₂ b₁ + b₂)`, proved from
the two stages' soundness fields (Python `Contract.__rshift__`). -/
theorem comp_sound (g : Contract S Y Z) (f : Contract S X Y) (ω : Ω)
    (hω : (g.comp f).bad ω = false) (x x' : X.carrier) (hd : (g.comp f).dom (X.err x x')) :
    Z.err ((g.comp f).exact x) ((g.comp f).approx ω x') ≤
      g.a * f.a * X.err x x' + (g.a * f.b + g.b) :=
  (g.comp f).sound ω hω x x' hd

/-- The identity contract is sound everywhere: `e_out ≤ 1 · e_in + 0`, never failing (Python
`identity`). -/
theorem id_sound (S : Sample Ω) (X : Space α i) (ω : Ω) (x x' : X.carrier) :
    X.err ((Contract.id S X).exact x) ((Contract.id S X).approx ω x') ≤ 1 * X.err x x' + 0 :=
  (Contract.id S X).sound ω rfl x x' trivial

/-- Slopes compose associatively. -/
theorem comp_a_assoc (h : Contract S Z W) (g : Contract S Y Z) (f : Contract S X Y) :
    ((h.comp g).comp f).a = (h.comp (g.comp f)).a := by
  show h.a * g.a * f.a = h.a * (g.a * f.a)
  grind

/-- Offsets compose associatively. -/
theorem comp_b_assoc (h : Contract S Z W) (g : Contract S Y Z) (f : Contract S X Y) :
    ((h.comp g).comp f).b = (h.comp (g.comp f)).b := by
  show h.a * g.a * f.b + (h.a * g.b + h.b) = h.a * (g.a * f.b + g.b) + h.b
  grind

/-- Deltas compose associatively. -/
theorem comp_delta_assoc (h : Contract S Z W) (g : Contract S Y Z) (f : Contract S X Y) :
    ((h.comp g).comp f).delta = (h.comp (g.comp f)).delta := by
  show f.delta + (g.delta + h.delta) = f.delta + g.delta + h.delta
  grind

/-- Tiers compose associatively. -/
theorem comp_tier_assoc (h : Contract S Z W) (g : Contract S Y Z) (f : Contract S X Y) :
    ((h.comp g).comp f).tier = (h.comp (g.comp f)).tier :=
  (Tier.weakest_assoc f.tier g.tier h.tier).symm

/-- The identity is a left unit for the slope and the offset. -/
theorem id_comp_a_b (f : Contract S X Y) :
    ((Contract.id S Y).comp f).a = f.a ∧ ((Contract.id S Y).comp f).b = f.b := by
  constructor
  · show 1 * f.a = f.a
    grind
  · show 1 * f.b + 0 = f.b
    grind

/-- The identity is a right unit for the slope and the offset. -/
theorem comp_id_a_b (f : Contract S X Y) :
    (f.comp (Contract.id S X)).a = f.a ∧ (f.comp (Contract.id S X)).b = f.b := by
  constructor
  · show f.a * 1 = f.a
    grind
  · show f.a * 0 + f.b = f.b
    grind

/-- The identity leaves the tier unchanged. -/
theorem id_comp_tier (f : Contract S X Y) : ((Contract.id S Y).comp f).tier = f.tier :=
  Tier.weakest_certified f.tier

end Contract

/-! ### Monotone transfers -/

/-- A semantic contract with a monotone transfer: outside the failure event, on the domain,
`e_out ≤ transfer e_in`. The affine contracts are the transfers `e ↦ a * e + b`
(`Contract.toMono`). -/
structure MonoContract {Ω : Type} {s t : Site} {i : Metric s} {o : Metric t} (S : Sample Ω)
    (X : Space α i) (Y : Space α o) where
  /-- The exact map of the stage. -/
  exact : X.carrier → Y.carrier
  /-- The approximate map of the stage at the sample point `ω`. -/
  approx : Ω → X.carrier → Y.carrier
  /-- The bound on the output error as a function of the input error. -/
  transfer : α → α
  /-- The transfer is monotone. -/
  mono : ∀ {e e' : α}, e ≤ e' → transfer e ≤ transfer e'
  /-- Domain of validity, a predicate on the input error. -/
  dom : α → Prop
  /-- The domain is closed downwards. -/
  dom_down : ∀ {e e' : α}, e ≤ e' → dom e' → dom e
  /-- The failure event. -/
  bad : Ω → Bool
  /-- Failure probability. -/
  delta : α
  /-- The failure event has probability at most `delta`. -/
  prob_bad : S.prob (α := α) bad ≤ delta
  /-- Tier, decided from the evidence. -/
  tier : Tier
  /-- Soundness: outside the failure event, on the domain, `e_out ≤ transfer e_in`. -/
  sound : ∀ ω, bad ω = false → ∀ x x', dom (X.err x x') →
    Y.err (exact x) (approx ω x') ≤ transfer (X.err x x')

namespace MonoContract

variable {Ω : Type} {S : Sample Ω} {s t u : Site} {i : Metric s} {m : Metric t}
  {n : Metric u} {X : Space α i} {Y : Space α m} {Z : Space α n}

/-- Series composition: first `f`, then `g`. The transfer is `g.transfer ∘ f.transfer`, the
failure events are united and the deltas add, the tier is the weakest, and `g`'s domain is
pulled back along `f.transfer`. -/
noncomputable def comp (g : MonoContract S Y Z) (f : MonoContract S X Y) :
    MonoContract S X Z where
  exact x := g.exact (f.exact x)
  approx ω x' := g.approx ω (f.approx ω x')
  transfer e := g.transfer (f.transfer e)
  mono h := g.mono (f.mono h)
  dom e := f.dom e ∧ g.dom (f.transfer e)
  dom_down h hd := ⟨f.dom_down h hd.1, g.dom_down (f.mono h) hd.2⟩
  bad ω := f.bad ω || g.bad ω
  delta := f.delta + g.delta
  prob_bad := by
    have h := S.prob_or_le (α := α) f.bad g.bad
    have h₁ := f.prob_bad
    have h₂ := g.prob_bad
    grind
  tier := Tier.weakest f.tier g.tier
  sound ω hω x x' hd := by
    obtain ⟨hf, hg⟩ := or_eq_false hω
    have h₁ := f.sound ω hf x x' hd.1
    have h₂ := g.sound ω hg _ _ (g.dom_down h₁ hd.2)
    exact le_trans' h₂ (g.mono h₁)

/-- Transfers compose as functions. -/
theorem comp_transfer (g : MonoContract S Y Z) (f : MonoContract S X Y) (e : α) :
    (g.comp f).transfer e = g.transfer (f.transfer e) := rfl

/-- Failure probabilities add under composition. -/
theorem comp_delta (g : MonoContract S Y Z) (f : MonoContract S X Y) :
    (g.comp f).delta = f.delta + g.delta := rfl

/-- The tier of a composite is the weakest of the tiers of its stages. -/
theorem comp_tier (g : MonoContract S Y Z) (f : MonoContract S X Y) :
    (g.comp f).tier = Tier.weakest f.tier g.tier := rfl

end MonoContract

namespace Contract

variable {Ω : Type} {S : Sample Ω} {s t u : Site} {i : Metric s} {m : Metric t}
  {n : Metric u} {X : Space α i} {Y : Space α m} {Z : Space α n}

/-- An affine contract as a monotone transfer `e ↦ a * e + b` (monotone because `0 ≤ a`). -/
noncomputable def toMono (c : Contract S X Y) : MonoContract S X Y where
  exact := c.exact
  approx := c.approx
  transfer e := c.a * e + c.b
  mono h := affine_mono c.a_nonneg h
  dom := c.dom
  dom_down := c.dom_down
  bad := c.bad
  delta := c.delta
  prob_bad := c.prob_bad
  tier := c.tier
  sound := c.sound

/-- The transfer of an affine composite is the composite of the transfers. -/
theorem toMono_comp_transfer (g : Contract S Y Z) (f : Contract S X Y) (e : α) :
    (g.comp f).toMono.transfer e = (g.toMono.comp f.toMono).transfer e := by
  show g.a * f.a * e + (g.a * f.b + g.b) = g.a * (f.a * e + f.b) + g.b
  grind

end Contract

/-! ### Suprema over a list of coordinates -/

/-- The larger of two elements. -/
noncomputable def maxA (x y : α) : α := @ite α (x ≤ y) (Classical.propDecidable _) y x

/-- The first element is at most the larger. -/
theorem le_maxA_left (x y : α) : x ≤ maxA x y := by
  unfold maxA; split <;> grind

/-- The second element is at most the larger. -/
theorem le_maxA_right (x y : α) : y ≤ maxA x y := by
  unfold maxA; split <;> grind

/-- The supremum of `f t` over the coordinates `t` of `L`, and `0` (errors are measured from
`0`). -/
noncomputable def lsup {β : Type} (f : β → α) : List β → α
  | [] => 0
  | x :: xs => maxA (f x) (lsup f xs)

/-- Every `f t` is at most the supremum. -/
theorem le_lsup {β : Type} (f : β → α) (L : List β) : ∀ t ∈ L, f t ≤ lsup f L := by
  induction L with
  | nil => intro t ht; cases ht
  | cons x L ih =>
    intro t ht
    have h₁ := le_maxA_left (f x) (lsup f L)
    have h₂ := le_maxA_right (f x) (lsup f L)
    simp only [lsup]
    rcases List.mem_cons.mp ht with rfl | ht
    · exact h₁
    · have := ih t ht
      grind

/-- The supremum is nonnegative. -/
theorem lsup_nonneg {β : Type} (f : β → α) (L : List β) : 0 ≤ lsup f L := by
  induction L with
  | nil => simp only [lsup]; grind
  | cons x L ih =>
    simp only [lsup]
    have := le_maxA_right (f x) (lsup f L)
    grind

/-! ### Softmax to total variation, over an ordered field with an exponential -/

/-- Logits on the coordinates `L`, with the sup-norm error `max_t |z_t − z'_t|`. -/
noncomputable def logitSpace {β : Type} (L : List β) (s : Site) :
    Space α (.logitLinf s) where
  carrier := β → α
  err z z' := lsup (fun t => Analytic.absA (z t - z' t)) L

/-- Attention weights on the coordinates `L`, with the total variation error. -/
noncomputable def tvSpace {β : Type} (L : List β) (s : Site) :
    Space α (.attentionTV s) where
  carrier := β → α
  err p q := Analytic.tv p q L

/-- The e-form transfer `ε ↦ ½ (exp (2ε) − 1)` is monotone. -/
theorem eform_mono (E : Analytic.ExpLaws α) {e e' : α} (h : e ≤ e') :
    (1 / 2) * (E.exp (2 * e) - 1) ≤ (1 / 2) * (E.exp (2 * e') - 1) := by
  have := Analytic.ExpLaws.exp_le_exp E (show 2 * e ≤ 2 * e' by grind)
  grind

/-- The e-form softmax-to-TV bridge as a monotone-transfer contract: the exact and the
approximate maps are softmax, the transfer is `ε ↦ ½ (exp (2ε) − 1)`, and the soundness field
is `WitCert.Analytic.softmax_tv_eform_sound`. -/
noncomputable def softmaxTVEform {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (S : Sample Ω) (s : Site) :
    MonoContract S (logitSpace (α := α) L s) (tvSpace L s) where
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

/-- The affine softmax-to-TV bridge on the domain `ε ≤ ε₀` as an affine contract
`TV ≤ exp (2ε₀) · ε + 0`; the soundness field is `WitCert.Analytic.softmax_tv_affine_sound`. -/
noncomputable def softmaxTVAffine {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (ε₀ : α) (S : Sample Ω) (s : Site) :
    Contract S (logitSpace (α := α) L s) (tvSpace L s) where
  exact z := Analytic.softmax E z L
  approx _ z' := Analytic.softmax E z' L
  a := E.exp (2 * ε₀)
  b := 0
  a_nonneg := Std.le_of_lt (E.exp_pos _)
  dom e := e ≤ ε₀
  dom_down h h' := le_trans' h h'
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ z z' hd := le_add_zero (Analytic.softmax_tv_affine_sound E z z' L hL
    (lsup_nonneg (fun t => Analytic.absA (z t - z' t)) L) hd
    (fun t ht => le_lsup (fun t => Analytic.absA (z t - z' t)) L t ht))

/-- The slope of the affine softmax bridge is `exp (2ε₀)`. -/
theorem softmaxTVAffine_a {Ω : Type} {β : Type} (E : Analytic.ExpLaws α) (L : List β)
    (hL : L ≠ []) (ε₀ : α) (S : Sample Ω) (s : Site) :
    (softmaxTVAffine E L hL ε₀ S s).a = E.exp (2 * ε₀) := rfl

end Field

/-! ### Bridges over `Rat` -/

section RatBridges

variable {Ω : Type} {β : Type}

/-- A sum of nonnegative terms is nonnegative. -/
theorem sum_nonneg (L : List β) (w : β → Rat) (hw : ∀ t ∈ L, 0 ≤ w t) :
    0 ≤ (L.map w).sum := by
  induction L with
  | nil => simp only [List.map_nil, List.sum_nil] <;> grind
  | cons x L ih =>
    simp only [List.map_cons, List.sum_cons]
    have h₁ := hw x (by simp)
    have h₂ := ih (fun t ht => hw t (by simp [ht]))
    grind

/-- `⟨q, k⟩ − ⟨q, k'⟩ = ⟨q, k − k'⟩`. -/
theorem dot_map_sub (L : List β) (q k k' : β → Rat) :
    Bridges.dot (L.map fun t => (q t, k t)) - Bridges.dot (L.map fun t => (q t, k' t)) =
      Bridges.dot (L.map fun t => (q t, k t - k' t)) := by
  induction L with
  | nil => simp only [Bridges.dot, List.map_nil, List.sum_nil] <;> grind
  | cons x L ih =>
    simp only [Bridges.dot, List.map_cons, List.sum_cons] at ih ⊢
    grind

/-- The squared norm of the first coordinates of `L.map (q, d)` is `Σ q²`. -/
theorem normSqFst_map (L : List β) (q d : β → Rat) :
    Bridges.normSqFst (L.map fun t => (q t, d t)) = (L.map fun t => q t * q t).sum := by
  induction L with
  | nil => simp only [Bridges.normSqFst, List.map_nil]
  | cons x L ih =>
    simp only [Bridges.normSqFst, List.map_cons, List.sum_cons] at ih ⊢
    rw [ih]

/-- The squared norm of the second coordinates of `L.map (q, d)` is `Σ d²`. -/
theorem normSqSnd_map (L : List β) (q d : β → Rat) :
    Bridges.normSqSnd (L.map fun t => (q t, d t)) = (L.map fun t => d t * d t).sum := by
  induction L with
  | nil => simp only [Bridges.normSqSnd, List.map_nil]
  | cons x L ih =>
    simp only [Bridges.normSqSnd, List.map_cons, List.sum_cons] at ih ⊢
    rw [ih]

/-- The first coordinates of `L.map (w, d)` are `L.map w`. -/
theorem map_fst_map (L : List β) (w d : β → Rat) :
    (L.map fun t => (w t, d t)).map Prod.fst = L.map w := by
  induction L with
  | nil => simp only [List.map_nil]
  | cons x L ih => simp only [List.map_cons, ih]

/-- The squared Euclidean error `Σ_t (k_t − k'_t)²` of two vectors on the coordinates `L`. -/
noncomputable def keyErr (L : List β) (k k' : β → Rat) : Rat :=
  (L.map fun t => (k t - k' t) * (k t - k' t)).sum

/-- An element whose square is at most `0` is `0`. -/
theorem eq_zero_of_mul_self_nonpos {x : Rat} (h : x * x ≤ 0) : x = 0 := by
  by_cases h₁ : 0 < x
  · have := Lean.Grind.OrderedRing.mul_pos h₁ h₁
    grind
  · by_cases h₂ : x < 0
    · have := Lean.Grind.OrderedRing.mul_pos (show (0 : Rat) < -x by grind)
        (show (0 : Rat) < -x by grind)
      grind
    · grind

/-- Two vectors at squared error at most `0` have the same error against any third. -/
theorem keyErr_congr_of_nonpos (L : List β) (k k' j : β → Rat) (h : keyErr L k k' ≤ 0) :
    keyErr L k j = keyErr L k' j := by
  induction L with
  | nil => simp only [keyErr, List.map_nil]
  | cons x L ih =>
    simp only [keyErr, List.map_cons, List.sum_cons] at ih h ⊢
    have hR := sum_nonneg L (fun t => (k t - k' t) * (k t - k' t))
      (fun t _ => Bridges.mul_self_nonneg _)
    have hx := Bridges.mul_self_nonneg (k x - k' x)
    have e : k x - k' x = 0 := eq_zero_of_mul_self_nonpos (by grind)
    have e' : k x = k' x := by grind
    rw [ih (by grind), e']

/-- A vector is at squared error `0` from itself. -/
theorem keyErr_self (L : List β) (k : β → Rat) : keyErr L k k = 0 := by
  induction L with
  | nil => simp only [keyErr, List.map_nil, List.sum_nil]
  | cons x L ih =>
    simp only [keyErr, List.map_cons, List.sum_cons] at ih ⊢
    rw [ih]
    grind

/-- Key vectors on the coordinates `L` with the squared Euclidean error. -/
noncomputable def keySpace (L : List β) (s : Site) : Space Rat (.keyResidualAbs s) where
  carrier := β → Rat
  err k k' := keyErr L k k'

/-- One logit with the squared error `(z − z')²`. -/
noncomputable def logitSqSpace (s : Site) : Space Rat (.logitLinf s) where
  carrier := Rat
  err z z' := (z - z') * (z - z')

/-- Value vectors on the coordinates `L` with the sup-norm error `max_t |v_t − v'_t|`. -/
noncomputable def valueSpace (L : List β) (s : Site) : Space Rat (.valueResidual s) where
  carrier := β → Rat
  err v v' := lsup (fun t => Bridges.abs (v t - v' t)) L

/-- One pooled value with the error `|y − y'|`. -/
noncomputable def pooledSpace (s : Site) : Space Rat (.pooledError s) where
  carrier := Rat
  err y y' := Bridges.abs (y - y')

/-- The score bridge in the form of a soundness field: for the query `q` and the scale `sc`, the
squared logit error `(sc ⟨q, k⟩ − sc ⟨q, k'⟩)²` is at most `sc² ‖q‖² ‖k − k'‖²`. From
`WitCert.Bridges.score_bridge_sound`. -/
theorem score_glue (L : List β) (q k k' : β → Rat) (sc : Rat) :
    (sc * Bridges.dot (L.map fun t => (q t, k t)) - sc * Bridges.dot (L.map fun t => (q t, k' t))) *
      (sc * Bridges.dot (L.map fun t => (q t, k t)) -
        sc * Bridges.dot (L.map fun t => (q t, k' t))) ≤
      sc * sc * (L.map fun t => q t * q t).sum * keyErr L k k' + 0 := by
  have h := Bridges.score_bridge_sound (L.map fun t => (q t, k t - k' t)) sc
  rw [normSqFst_map L q (fun t => k t - k' t), normSqSnd_map L q (fun t => k t - k' t)] at h
  have e : sc * Bridges.dot (L.map fun t => (q t, k t)) -
      sc * Bridges.dot (L.map fun t => (q t, k' t)) =
      sc * Bridges.dot (L.map fun t => (q t, k t - k' t)) := by
    rw [← dot_map_sub L q k k']
    grind
  rw [e]
  unfold keyErr
  grind

/-- The score bridge as a contract from keys to one logit: the exact and the approximate logits
are `sc ⟨q, k⟩` and `sc ⟨q, k'⟩`, and the squared errors obey
`e_out ≤ (sc² ‖q‖²) e_in + 0` (Python `score_bridge`). -/
noncomputable def scoreBridge (L : List β) (q : β → Rat) (sc : Rat) (S : Sample Ω) (s : Site) :
    Contract S (keySpace L s) (logitSqSpace s) where
  exact k := sc * Bridges.dot (L.map fun t => (q t, k t))
  approx _ k' := sc * Bridges.dot (L.map fun t => (q t, k' t))
  a := sc * sc * (L.map fun t => q t * q t).sum
  b := 0
  a_nonneg := Rat.mul_nonneg (Bridges.mul_self_nonneg sc)
    (sum_nonneg L (fun t => q t * q t) (fun t _ => Bridges.mul_self_nonneg (q t)))
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ k k' _ := score_glue L q k k' sc

/-- The storage witness in the form of a soundness field: if the stored form of every key is
within its witness, and every witness is at most `w`, a key stored from an exact input is within
`0 * e_in + w`. From `WitCert.Bridges.witness_sound`. -/
theorem storage_glue (L : List β) (store : (β → Rat) → (β → Rat)) (wit : (β → Rat) → Rat)
    {w : Rat} (hr : ∀ k, keyErr L k (store k) ≤ wit k) (hw : ∀ k, wit k ≤ w) (k k' : β → Rat)
    (hd : keyErr L k k' ≤ 0) : keyErr L k (store k') ≤ 0 * keyErr L k k' + w := by
  have h := Bridges.witness_sound [(keyErr L k' (store k'), wit k')] (w := w)
    (by intro p hp; simp only [List.mem_singleton] at hp; subst hp; exact hr k')
    (by intro p hp; simp only [List.mem_singleton] at hp; subst hp; exact hw k')
    (keyErr L k k') (keyErr L k' (store k'), wit k') (by simp)
  rw [keyErr_congr_of_nonpos L k k' (store k') hd]
  exact h

/-- The storage witness as a contract on keys (Python `witness_contract`, `a = 0`,
`b = witness_max`): the exact map keeps the key, the approximate map stores it; the domain is
an exact input (`e_in ≤ 0`). -/
noncomputable def storageWitness (L : List β) (store : (β → Rat) → (β → Rat))
    (wit : (β → Rat) → Rat) (w : Rat) (hr : ∀ k, keyErr L k (store k) ≤ wit k)
    (hw : ∀ k, wit k ≤ w) (S : Sample Ω) (s : Site) : Contract S (keySpace L s) (keySpace L s) where
  exact k := k
  approx _ k' := store k'
  a := 0
  b := w
  a_nonneg := by grind
  dom e := e ≤ 0
  dom_down h h' := le_trans' h h'
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ k k' hd := storage_glue L store wit hr hw k k' hd

/-- The pooling bridge in the form of a soundness field: with nonnegative weights `w`,
`|⟨w, v⟩ − ⟨w, v'⟩| ≤ (Σ w) max_t |v_t − v'_t|`. From `WitCert.Bridges.pooling_max_caliber`. -/
theorem pooling_glue (L : List β) (w : β → Rat) (hw : ∀ t ∈ L, 0 ≤ w t) (v v' : β → Rat) :
    Bridges.abs (Bridges.dot (L.map fun t => (w t, v t)) -
      Bridges.dot (L.map fun t => (w t, v' t))) ≤
      (L.map w).sum * lsup (fun t => Bridges.abs (v t - v' t)) L + 0 := by
  have h := Bridges.pooling_max_caliber (L.map fun t => (w t, v t - v' t))
    (M := lsup (fun t => Bridges.abs (v t - v' t)) L)
    (by intro p hp; obtain ⟨t, ht, rfl⟩ := List.mem_map.mp hp; exact hw t ht)
    (by
      intro p hp
      obtain ⟨t, ht, rfl⟩ := List.mem_map.mp hp
      exact le_lsup (fun t => Bridges.abs (v t - v' t)) L t ht)
  rw [map_fst_map L w (fun t => v t - v' t)] at h
  rw [dot_map_sub L w v v']
  exact le_add_zero h

/-- The pooling bridge, max caliber, as a contract from values to one pooled value (Python
`pooling(...).max`, `a = ‖w‖₁`). -/
noncomputable def poolingBridge (L : List β) (w : β → Rat) (hw : ∀ t ∈ L, 0 ≤ w t)
    (S : Sample Ω) (s : Site) : Contract S (valueSpace L s) (pooledSpace s) where
  exact v := Bridges.dot (L.map fun t => (w t, v t))
  approx _ v' := Bridges.dot (L.map fun t => (w t, v' t))
  a := (L.map w).sum
  b := 0
  a_nonneg := sum_nonneg L w hw
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ v v' _ := pooling_glue L w hw v v'

/-- Attention weights on `n` positions (a list of length `n`), with the total variation
`½ Σ_i |p_i − p'_i|` of two of them as the error. -/
noncomputable def weightSpace (n : Nat) (s : Site) : Space Rat (.attentionTV s) where
  carrier := {l : List Rat // l.length = n}
  err p p' := Bridges.tv (List.zip p.1 p'.1)

/-- Zipping with a list of zeros of the same length puts each entry against `0`. -/
theorem zip_replicate_zero_right (l : List Rat) :
    List.zip l (List.replicate l.length (0 : Rat)) = l.map fun x => (x, (0 : Rat)) := by
  induction l with
  | nil => rfl
  | cons x l ih => simp only [List.length_cons, List.replicate_succ, List.zip_cons_cons,
      List.map_cons, ih]

/-- A list of zeros zipped with a list of the same length puts `0` against each entry. -/
theorem zip_replicate_zero_left (l : List Rat) :
    List.zip (List.replicate l.length (0 : Rat)) l = l.map fun x => ((0 : Rat), x) := by
  induction l with
  | nil => rfl
  | cons x l ih => simp only [List.length_cons, List.replicate_succ, List.zip_cons_cons,
      List.map_cons, ih]

/-- The rank-prefix selection bridge in the form of a soundness field: the exact weights keep
the `dropped` mass the selection lost (where the selected weights are `0`), the selected
weights carry the `added` mass (where the exact ones are `0`), and the total variation over all
positions is at most `1 · TV` over the kept ones plus `selectionOffset m_out m_in`. From
`WitCert.Bridges.rank_prefix_selection_offset_sound`. -/
theorem selection_glue {n : Nat} (dropped added : List Rat) {mOut mIn : Rat}
    (hd : ∀ x ∈ dropped, 0 ≤ x) (ha : ∀ x ∈ added, 0 ≤ x) (hOut : dropped.sum ≤ mOut)
    (hIn : added.sum ≤ mIn) (p p' : {l : List Rat // l.length = n}) :
    Bridges.tv (List.zip (p.1 ++ dropped ++ List.replicate added.length 0)
        (p'.1 ++ List.replicate dropped.length 0 ++ added)) ≤
      1 * Bridges.tv (List.zip p.1 p'.1) + Bridges.selectionOffset mOut mIn := by
  have hl : (p.1 ++ dropped).length = (p'.1 ++ List.replicate dropped.length 0).length := by
    simp only [List.length_append, List.length_replicate, p.2, p'.2]
  have hp : p.1.length = p'.1.length := by rw [p.2, p'.2]
  rw [List.zip_append hl, List.zip_append hp, zip_replicate_zero_right,
    zip_replicate_zero_left]
  have h := Bridges.rank_prefix_selection_offset_sound (List.zip p.1 p'.1) dropped added hd ha
    hOut hIn
  grind

/-- Rank-prefix selection as a contract on attention weights (Python `rank_prefix_selection`,
`(a, b) = (1, (m_out + m_in) / 2)`): from the weights on the `n` positions both the exact and
the selected attention keep, to the weights on all `n + |dropped| + |added|` positions. -/
noncomputable def selectionBridge (n : Nat) (dropped added : List Rat) {mOut mIn : Rat}
    (hd : ∀ x ∈ dropped, 0 ≤ x) (ha : ∀ x ∈ added, 0 ≤ x) (hOut : dropped.sum ≤ mOut)
    (hIn : added.sum ≤ mIn) (S : Sample Ω) (s : Site) :
    Contract S (weightSpace n s) (weightSpace (n + dropped.length + added.length) s) where
  exact p := ⟨p.1 ++ dropped ++ List.replicate added.length 0, by
    simp only [List.length_append, List.length_replicate, p.2]⟩
  approx _ p' := ⟨p'.1 ++ List.replicate dropped.length 0 ++ added, by
    simp only [List.length_append, List.length_replicate, p'.2]⟩
  a := 1
  b := Bridges.selectionOffset mOut mIn
  a_nonneg := by decide
  dom _ := True
  dom_down _ h := h
  bad _ := false
  delta := 0
  prob_bad := S.prob_never_le
  tier := .certified
  sound _ _ p p' _ := selection_glue dropped added hd ha hOut hIn p p'

/-- The chain storage witness → score bridge, built with `Contract.comp`: its soundness is
composed from `WitCert.Bridges.witness_sound` and `WitCert.Bridges.score_bridge_sound`. -/
noncomputable def storageScore (L : List β) (q : β → Rat) (sc : Rat)
    (store : (β → Rat) → (β → Rat)) (wit : (β → Rat) → Rat) (w : Rat)
    (hr : ∀ k, keyErr L k (store k) ≤ wit k) (hw : ∀ k, wit k ≤ w) (S : Sample Ω) (s : Site) :
    Contract S (keySpace L s) (logitSqSpace s) :=
  (scoreBridge L q sc S s).comp (storageWitness L store wit w hr hw S s)

/-- The chain's bound: a stored key moves the squared logit by at most `sc² ‖q‖² w`. -/
theorem storageScore_b (L : List β) (q : β → Rat) (sc : Rat)
    (store : (β → Rat) → (β → Rat)) (wit : (β → Rat) → Rat) (w : Rat)
    (hr : ∀ k, keyErr L k (store k) ≤ wit k) (hw : ∀ k, wit k ≤ w) (S : Sample Ω) (s : Site) :
    (storageScore L q sc store wit w hr hw S s).b =
      sc * sc * (L.map fun t => q t * q t).sum * w + 0 :=
  rfl

/-- The chain's soundness, unfolded: the logit of a stored key, against the logit of the key,
has squared error at most `sc² ‖q‖² w`. -/
theorem storageScore_sound (L : List β) (q : β → Rat) (sc : Rat)
    (store : (β → Rat) → (β → Rat)) (wit : (β → Rat) → Rat) (w : Rat)
    (hr : ∀ k, keyErr L k (store k) ≤ wit k) (hw : ∀ k, wit k ≤ w) (S : Sample Ω) (s : Site)
    (ω : Ω) (k : β → Rat) :
    (logitSqSpace s).err ((storageScore L q sc store wit w hr hw S s).exact k)
      ((storageScore L q sc store wit w hr hw S s).approx ω k) ≤
      (storageScore L q sc store wit w hr hw S s).a * keyErr L k k +
        (storageScore L q sc store wit w hr hw S s).b := by
  have h0 : keyErr L k k ≤ 0 := by
    have := keyErr_self L k
    grind
  exact (storageScore L q sc store wit w hr hw S s).sound ω rfl k k
    (show _ ∧ _ from ⟨h0, trivial⟩)

/-- A recurrence: the step contracts `cs` on one state space composed in order (the head of the
list first), after `acc` (Python `recurrence` starts from the identity). -/
noncomputable def Contract.recurrence {s : Site} {i : Metric s} {S : Sample Ω} {X : Space Rat i}
    (acc : Contract S X X) (cs : List (Contract S X X)) : Contract S X X :=
  cs.foldl (fun acc c => c.comp acc) acc

/-- The coefficients of a recurrence are `WitCert.Bridges.recurrenceCoeffs` of its steps, the
coefficients of `WitCert.Bridges.recurrence_comp_sound`. -/
theorem Contract.recurrence_coeffs {s : Site} {i : Metric s} {S : Sample Ω} {X : Space Rat i}
    (acc : Contract S X X) (cs : List (Contract S X X)) :
    ((Contract.recurrence acc cs).a, (Contract.recurrence acc cs).b) =
      Bridges.recurrenceCoeffs (acc.a, acc.b) (cs.map fun c => (c.a, c.b)) := by
  induction cs generalizing acc with
  | nil => simp only [Contract.recurrence, Bridges.recurrenceCoeffs, List.map_nil, List.foldl_nil]
  | cons c cs ih =>
    simp only [Contract.recurrence, Bridges.recurrenceCoeffs, List.map_cons,
      List.foldl_cons] at ih ⊢
    exact ih (c.comp acc)

/-- A recurrence started from the identity has the coefficients `recurrenceCoeffs (1, 0)` of
Python's `recurrence`. -/
theorem Contract.recurrence_id_coeffs {s : Site} {i : Metric s} {S : Sample Ω} {X : Space Rat i}
    (cs : List (Contract S X X)) :
    ((Contract.recurrence (Contract.id S X) cs).a, (Contract.recurrence (Contract.id S X) cs).b) =
      Bridges.recurrenceCoeffs (1, 0) (cs.map fun c => (c.a, c.b)) :=
  Contract.recurrence_coeffs (Contract.id S X) cs

/-- A recurrence is sound with the coefficients of `WitCert.Bridges.recurrence_comp_sound`:
outside the failure events of its steps, on its domain, the final state error is at most
`A e₀ + B` with `(A, B) = recurrenceCoeffs (1, 0) steps`. The proof is the composed soundness of
the steps. -/
theorem Contract.recurrence_sound {s : Site} {i : Metric s} {S : Sample Ω} {X : Space Rat i}
    (cs : List (Contract S X X)) (ω : Ω)
    (hω : (Contract.recurrence (Contract.id S X) cs).bad ω = false) (x x' : X.carrier)
    (hd : (Contract.recurrence (Contract.id S X) cs).dom (X.err x x')) :
    X.err ((Contract.recurrence (Contract.id S X) cs).exact x)
        ((Contract.recurrence (Contract.id S X) cs).approx ω x') ≤
      (Bridges.recurrenceCoeffs (1, 0) (cs.map fun c => (c.a, c.b))).1 * X.err x x' +
        (Bridges.recurrenceCoeffs (1, 0) (cs.map fun c => (c.a, c.b))).2 := by
  have h := (Contract.recurrence (Contract.id S X) cs).sound ω hω x x' hd
  rw [← Contract.recurrence_id_coeffs cs]
  exact h

/-- Erasing a contract over `Rat`: its phantom `WitCert.Contract` (the maps, the proof and the
domain are forgotten). -/
noncomputable def Contract.erase {s t : Site} {i : Metric s} {o : Metric t} {S : Sample Ω}
    {X : Space Rat i} {Y : Space Rat o} (c : Contract S X Y) : WitCert.Contract i o :=
  ⟨c.a, c.b, c.delta, c.tier, []⟩

/-- Erasing commutes with composition: the semantic composite has exactly the numbers of the
phantom composite `WitCert.Contract.comp`. -/
theorem Contract.erase_comp {s t u : Site} {i : Metric s} {m : Metric t} {n : Metric u}
    {S : Sample Ω} {X : Space Rat i} {Y : Space Rat m} {Z : Space Rat n}
    (g : Contract S Y Z) (f : Contract S X Y) : (g.comp f).erase = g.erase.comp f.erase := by
  apply WitCert.Contract.ext <;>
    simp [Semantic.Contract.erase, Semantic.Contract.comp, WitCert.Contract.comp]

/-- A space of rationals with the error `|x − x'|`, at any metric. -/
noncomputable def ratSpace {s : Site} (m : Metric s) : Space Rat m :=
  ⟨Rat, fun x x' => Bridges.abs (x - x')⟩

end RatBridges

/-! ### Ill-typed compositions

Semantic contracts keep the metric typing: two spaces with the same carrier and the same error
functional, at two different metrics or at two different sites, are different types, so
composing through them does not elaborate. `#guard_msgs` pins the exact errors. -/

noncomputable section IllTyped

-- Metric mismatch: a contract into a key-residual space followed by one out of a TV space.
/--
error: Application type mismatch: The argument
  f
has type
  Contract S (ratSpace (Metric.keyResidualAbs Site.atConsume)) (ratSpace (Metric.keyResidualAbs Site.atConsume))
but is expected to have type
  Contract S (ratSpace (Metric.keyResidualAbs Site.atConsume)) (ratSpace (Metric.attentionTV Site.atConsume))
in the application
  g.comp f
-/
#guard_msgs in
example (S : Sample Unit)
    (g : Contract S (ratSpace (.attentionTV .atConsume)) (ratSpace (.attentionTV .atConsume)))
    (f : Contract S (ratSpace (.keyResidualAbs .atConsume))
      (ratSpace (.keyResidualAbs .atConsume))) :
    Contract S (ratSpace (.keyResidualAbs .atConsume)) (ratSpace (.attentionTV .atConsume)) :=
  g.comp f

-- Site mismatch: the same metric written at the write site, consumed at the consumption site.
/--
error: Application type mismatch: The argument
  f
has type
  Contract S (ratSpace (Metric.keyResidualAbs Site.atWrite)) (ratSpace (Metric.keyResidualAbs Site.atWrite))
but is expected to have type
  Contract S (ratSpace (Metric.keyResidualAbs Site.atWrite)) (ratSpace (Metric.keyResidualAbs Site.atConsume))
in the application
  g.comp f
-/
#guard_msgs in
example (S : Sample Unit)
    (g : Contract S (ratSpace (.keyResidualAbs .atConsume)) (ratSpace (.logitLinf .atConsume)))
    (f : Contract S (ratSpace (.keyResidualAbs .atWrite)) (ratSpace (.keyResidualAbs .atWrite))) :
    Contract S (ratSpace (.keyResidualAbs .atWrite)) (ratSpace (.logitLinf .atConsume)) :=
  g.comp f

-- A bridge composed with a bridge whose metric does not match: pooling after the score bridge.
/--
error: Application type mismatch: The argument
  scoreBridge L q 1 S Site.atConsume
has type
  Contract S (keySpace L Site.atConsume) (logitSqSpace Site.atConsume)
but is expected to have type
  Contract S (keySpace L Site.atConsume) (valueSpace L Site.atConsume)
in the application
  (poolingBridge L w hw S Site.atConsume).comp (scoreBridge L q 1 S Site.atConsume)
-/
#guard_msgs in
example (S : Sample Unit) (L : List Nat) (q w : Nat → Rat) (hw : ∀ t ∈ L, 0 ≤ w t) :
    Contract S (keySpace L .atConsume) (pooledSpace .atConsume) :=
  (poolingBridge L w hw S .atConsume).comp (scoreBridge L q 1 S .atConsume)

end IllTyped

end WitCert.Semantic

end
