/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Metrics
public import WitCert.Tiers

/-!
# Contracts `e_out ≤ a * e_in + b`, typed by metric

Mirror of `witcert_calculus.contracts`. A `Contract i o` promises that whenever the error
entering a stage, measured in metric `i`, is `e_in` and lies in the contract's domain, the error
leaving it, measured in metric `o`, is at most `a * e_in + b`, except with probability `delta`.
The metrics are type indices, so a composition whose stages do not meet in the same metric
(and at the same site) does not typecheck.

## Main definitions

* `WitCert.Constraint`: a linear domain constraint `coeff * e ≤ bound` on an input error.
* `WitCert.Contract`: coefficients `a b : Rat`, failure probability `delta`, tier, domain.
* `WitCert.Contract.comp`: series composition `g.comp f` (first `f`, then `g`; Python `f >> g`
  or `g @ f`).
* `WitCert.Contract.id`: the identity contract.
* `WitCert.Contract.cap`: the tightest cap `e ≤ cap` implied by the domain (Python's `cap`).

## Main statements

* `WitCert.Contract.comp_sound`: `e_mid ≤ a₁ e_in + b₁`, `e_out ≤ a₂ e_mid + b₂`, `0 ≤ a₂`
  give `e_out ≤ (a₂ a₁) e_in + (a₂ b₁ + b₂)`.
* `WitCert.Contract.comp_a`, `comp_b`, `comp_delta`, `comp_tier`: the exact coefficients,
  deltas add (union bound), the tier is the weakest.
* `WitCert.Contract.comp_assoc`, `id_comp`, `comp_id`: contracts form a category.
* `WitCert.Contract.comp_domain_sound`: the composite holds on the propagated domain.
* `WitCert.Contract.comp_cap_of_le`, `comp_cap_of_lt`: the propagated cap is Python's rule
  (`cap₁` when `a₁ cap₁ + b₁ ≤ cap₂`, otherwise `(cap₂ - b₁) / a₁`).

## Implementation notes

A domain is a list of constraints; a cap `e ≤ k` is the constraint `1 * e ≤ k`. Composition
pulls the second stage's constraints back along the first stage's bound, so associativity holds
as an equation of contracts. The ill-typed compositions rejected by the Python type checkers
are reproduced at the end of this file with their exact elaboration errors (`#guard_msgs`).

`cap` and `comp` are marked `noncomputable`: they are evaluated by the kernel (`decide +kernel`
in `WitCert.GeneratedChecks`), never run, and the WebAssembly Lean used in CI cannot generate
code for the list functions they use.
-/

@[expose] public section

namespace WitCert

/-- A linear constraint `coeff * e ≤ bound` on an input error `e`. -/
structure Constraint where
  /-- Coefficient of the input error. -/
  coeff : Rat
  /-- Right-hand side. -/
  bound : Rat
  deriving DecidableEq, Repr

namespace Constraint

/-- Whether `e` satisfies the constraint. -/
def Sat (k : Constraint) (e : Rat) : Prop := k.coeff * e ≤ k.bound

/-- The constraint on `e` that says `a * e + b` satisfies `k`. -/
def pullback (a b : Rat) (k : Constraint) : Constraint :=
  ⟨k.coeff * a, k.bound - k.coeff * b⟩

/-- The cap `e ≤ bound / coeff` a constraint with a positive coefficient imposes. -/
def cap? (k : Constraint) : Option Rat :=
  if 0 < k.coeff then some (k.bound / k.coeff) else none

/-- Pulling back twice is pulling back along the composite affine map. -/
theorem pullback_pullback (k : Constraint) (a₁ b₁ a₂ b₂ : Rat) :
    (k.pullback a₂ b₂).pullback a₁ b₁ = k.pullback (a₂ * a₁) (a₂ * b₁ + b₂) := by
  simp only [pullback, Constraint.mk.injEq]
  constructor <;> grind

/-- Pulling back along the identity does nothing. -/
theorem pullback_one_zero (k : Constraint) : k.pullback 1 0 = k := by
  cases k
  simp only [pullback, Constraint.mk.injEq]
  constructor <;> grind

/-- `pullback a b k` is satisfied at `e` exactly when `k` is satisfied at `a * e + b`. -/
theorem sat_pullback (k : Constraint) (a b e : Rat) :
    (k.pullback a b).Sat e ↔ k.Sat (a * e + b) := by
  simp only [Sat, pullback]
  constructor <;> intro h <;> grind

end Constraint

/-- The smaller of two optional caps (`none`: unbounded). -/
def minCap : Option Rat → Option Rat → Option Rat
  | none, y => y
  | some x, none => some x
  | some x, some y => some (min x y)

/-- A contract `e_out ≤ a * e_in + b` from metric `i` to metric `o`, except with probability
`delta`, on the inputs satisfying every constraint of `domain`. -/
@[ext] structure Contract {s t : Site} (i : Metric s) (o : Metric t) where
  /-- Slope. -/
  a : Rat
  /-- Offset. -/
  b : Rat
  /-- Failure probability. -/
  delta : Rat
  /-- Tier, decided from the evidence. -/
  tier : Tier
  /-- Domain of validity (`[]`: every nonnegative input). -/
  domain : List Constraint

namespace Contract

variable {s t u v : Site} {i : Metric s} {m : Metric t} {n : Metric u} {o : Metric v}

/-- The input error `e` is nonnegative and satisfies every domain constraint. -/
def InDomain (c : Contract i o) (e : Rat) : Prop := 0 ≤ e ∧ ∀ k ∈ c.domain, k.Sat e

/-- The contract's bound holds for the input error `eIn` and output error `eOut`. -/
def Holds (c : Contract i o) (eIn eOut : Rat) : Prop := c.InDomain eIn → eOut ≤ c.a * eIn + c.b

/-- The domain `e ≤ k` of a single optional cap (Python's `cap`). -/
def capDomain : Option Rat → List Constraint
  | none => []
  | some k => [⟨1, k⟩]

/-- The tightest cap `e ≤ cap` implied by the domain's constraints with positive coefficient. -/
noncomputable def cap (c : Contract i o) : Option Rat :=
  c.domain.foldr (fun k acc => minCap k.cap? acc) none

/-- Series composition: first `f`, then `g`. Coefficients `(a₂ a₁, a₂ b₁ + b₂)`, deltas add,
the tier is the weakest, and `g`'s domain is pulled back along `f`'s bound. -/
noncomputable def comp (g : Contract m o) (f : Contract i m) : Contract i o where
  a := g.a * f.a
  b := g.a * f.b + g.b
  delta := f.delta + g.delta
  tier := Tier.weakest f.tier g.tier
  domain := f.domain ++ g.domain.map (Constraint.pullback f.a f.b)

/-- The identity contract `e_out ≤ e_in` on one metric. -/
protected def id (m : Metric t) : Contract m m := ⟨1, 0, 0, .certified, []⟩

/-- Slope of a composite. -/
theorem comp_a (g : Contract m o) (f : Contract i m) : (g.comp f).a = g.a * f.a := rfl

/-- Offset of a composite. -/
theorem comp_b (g : Contract m o) (f : Contract i m) : (g.comp f).b = g.a * f.b + g.b := rfl

/-- Failure probabilities add under composition (union bound). -/
theorem comp_delta (g : Contract m o) (f : Contract i m) :
    (g.comp f).delta = f.delta + g.delta := rfl

/-- The tier of a composite is the weakest of the tiers of its stages. -/
theorem comp_tier (g : Contract m o) (f : Contract i m) :
    (g.comp f).tier = Tier.weakest f.tier g.tier := rfl

/-- Series composition is sound: `e_mid ≤ a₁ e_in + b₁` and `e_out ≤ a₂ e_mid + b₂` with
`0 ≤ a₂` give `e_out ≤ (a₂ a₁) e_in + (a₂ b₁ + b₂)`. -/
theorem comp_sound (g : Contract m o) (f : Contract i m) {e eMid eOut : Rat} (hg : 0 ≤ g.a)
    (h₁ : eMid ≤ f.a * e + f.b) (h₂ : eOut ≤ g.a * eMid + g.b) :
    eOut ≤ (g.comp f).a * e + (g.comp f).b := by
  have := Rat.mul_le_mul_of_nonneg_left h₁ hg
  simp only [comp]
  grind

/-- Domain propagation: if `f` holds on its domain, `g` holds on its domain (whose constraints
are monotone: nonnegative coefficients), and `e` lies in the composite's domain, the composite
bound holds at `e`. The composite's domain is `f`'s domain intersected with the inputs that `f`
cannot push outside `g`'s domain. -/
theorem comp_domain_sound (g : Contract m o) (f : Contract i m) {e eMid eOut : Rat}
    (hg : 0 ≤ g.a) (hmono : ∀ k ∈ g.domain, 0 ≤ k.coeff) (hMid : 0 ≤ eMid)
    (h₁ : f.Holds e eMid) (h₂ : g.Holds eMid eOut) (hd : (g.comp f).InDomain e) :
    eOut ≤ (g.comp f).a * e + (g.comp f).b := by
  obtain ⟨he, hk⟩ := hd
  have hf : f.InDomain e := ⟨he, fun k hkf => hk k (List.mem_append.2 (Or.inl hkf))⟩
  have hm := h₁ hf
  have hgd : g.InDomain eMid := by
    refine ⟨hMid, fun k hkg => ?_⟩
    have hp := hk (k.pullback f.a f.b) (List.mem_append.2 (Or.inr (List.mem_map.2 ⟨k, hkg, rfl⟩)))
    simp only [Constraint.Sat, Constraint.pullback] at hp ⊢
    have := Rat.mul_le_mul_of_nonneg_left hm (hmono k hkg)
    grind
  exact comp_sound g f hg hm (h₂ hgd)

private theorem map_pullback_comp (l : List Constraint) (a₁ b₁ a₂ b₂ : Rat) :
    (l.map (Constraint.pullback a₂ b₂)).map (Constraint.pullback a₁ b₁) =
      l.map (Constraint.pullback (a₂ * a₁) (a₂ * b₁ + b₂)) := by
  induction l with
  | nil => rfl
  | cons k l ih => simp only [List.map_cons, ih, Constraint.pullback_pullback]

private theorem map_pullback_one_zero (l : List Constraint) :
    l.map (Constraint.pullback 1 0) = l := by
  induction l with
  | nil => rfl
  | cons k l ih => simp only [List.map_cons, ih, Constraint.pullback_one_zero]

/-- Series composition is associative. -/
theorem comp_assoc (h : Contract n o) (g : Contract m n) (f : Contract i m) :
    (h.comp g).comp f = h.comp (g.comp f) := by
  ext
  · simp only [comp]; grind
  · simp only [comp]; grind
  · simp only [comp]; grind
  · simp only [comp, Tier.weakest_assoc]
  · simp only [comp, List.map_append, List.append_assoc, map_pullback_comp]

/-- The identity is a left unit of composition. -/
theorem id_comp (f : Contract i o) : (Contract.id o).comp f = f := by
  ext
  · simp only [comp, Contract.id]; grind
  · simp only [comp, Contract.id]; grind
  · simp only [comp, Contract.id]; grind
  · simp only [comp, Contract.id, Tier.weakest_certified]
  · simp only [comp, Contract.id, List.map_nil, List.append_nil]

/-- The identity is a right unit of composition. -/
theorem comp_id (f : Contract i o) : f.comp (Contract.id i) = f := by
  ext
  · simp only [comp, Contract.id]; grind
  · simp only [comp, Contract.id]; grind
  · simp only [comp, Contract.id]; grind
  · simp only [comp, Contract.id, Tier.certified_weakest]
  · simp only [comp, Contract.id, List.nil_append, map_pullback_one_zero]

/-- The identity contract is sound: an error that did not grow satisfies `e_out ≤ 1 e_in + 0`. -/
theorem id_sound (m : Metric t) {e eOut : Rat} (h : eOut ≤ e) :
    (Contract.id m).Holds e eOut := by
  intro _
  simp only [Contract.id]
  grind

/-- Adding two bounds of the same metric bounds the sum (Python `Reading.__add__`); the
failure probabilities add by the union bound. -/
theorem add_sound {x y u w : Rat} (hx : x ≤ u) (hy : y ≤ w) : x + y ≤ u + w := by
  grind

/-- With a cap on `f` and a cap on `g` that `f`'s worst output respects (`a₁ cap₁ + b₁ ≤ cap₂`),
the composite keeps `f`'s domain: every input of `f`'s domain is in the composite's. -/
theorem comp_cap_of_le (g : Contract m o) (f : Contract i m) {c₁ c₂ e : Rat}
    (hf : f.domain = capDomain (some c₁)) (hgd : g.domain = capDomain (some c₂))
    (ha : 0 ≤ f.a) (hle : f.a * c₁ + f.b ≤ c₂) (he : f.InDomain e) : (g.comp f).InDomain e := by
  obtain ⟨he0, hk⟩ := he
  have hc : e ≤ c₁ := by
    have := hk ⟨1, c₁⟩ (by simp [hf, capDomain])
    simp only [Constraint.Sat] at this
    grind
  refine ⟨he0, fun k hk' => ?_⟩
  simp only [comp, hf, hgd, capDomain, List.map_cons, List.map_nil, List.cons_append,
    List.nil_append, List.mem_cons, List.not_mem_nil, or_false] at hk'
  rcases hk' with rfl | rfl
  · simp only [Constraint.Sat]; grind
  · simp only [Constraint.Sat, Constraint.pullback]
    have := Rat.mul_le_mul_of_nonneg_left hc ha
    grind

/-- When `f`'s worst output can leave `g`'s cap, the composite holds on the sub-domain
`e ≤ (cap₂ - b₁) / a₁` (for `0 < a₁`), intersected with `f`'s cap. -/
theorem comp_cap_of_lt (g : Contract m o) (f : Contract i m) {c₁ c₂ e : Rat}
    (hf : f.domain = capDomain (some c₁)) (hgd : g.domain = capDomain (some c₂))
    (ha : 0 < f.a) (he0 : 0 ≤ e) (hc₁ : e ≤ c₁) (hc₂ : e ≤ (c₂ - f.b) / f.a) :
    (g.comp f).InDomain e := by
  refine ⟨he0, fun k hk' => ?_⟩
  simp only [comp, hf, hgd, capDomain, List.map_cons, List.map_nil, List.cons_append,
    List.nil_append, List.mem_cons, List.not_mem_nil, or_false] at hk'
  rcases hk' with rfl | rfl
  · simp only [Constraint.Sat]; grind
  · simp only [Constraint.Sat, Constraint.pullback]
    have h1 := Rat.mul_le_mul_of_nonneg_left hc₂ (Rat.le_of_lt ha)
    have h2 : f.a * ((c₂ - f.b) / f.a) = c₂ - f.b := by
      rw [Rat.mul_comm]
      exact Rat.div_mul_cancel (Rat.ne_of_gt ha)
    grind

end Contract

/-! ### Ill-typed compositions

The compositions that `mypy --strict` and `pyright` reject in the Python tests do not
elaborate here either; `#guard_msgs` pins the exact error, so the build fails if one of them
ever typechecks, or fails for another reason. -/

noncomputable section IllTyped

/-- The storage witness at the consumption site (Python `witness_contract(AtConsume, ...)`). -/
def storageStage : Contract (.keyResidualAbs .atConsume) (.keyResidualAbs .atConsume) :=
  ⟨0, 1 / 50, 0, .certified, []⟩

/-- The storage witness at the write site (Python `witness_contract(AtWrite, ...)`). -/
def storageAtWrite : Contract (.keyResidualAbs .atWrite) (.keyResidualAbs .atWrite) :=
  ⟨0, 1 / 50, 0, .certified, []⟩

/-- Rank-prefix selection (Python `rank_prefix_selection(AtConsume, ...)`). -/
def selectStage : Contract (.attentionTV .atConsume) (.attentionTV .atConsume) :=
  ⟨1, 1 / 100, 0, .certified, []⟩

/-- The score bridge at the consumption site (Python `score_bridge(AtConsume, ...)`). -/
def scoreStage : Contract (.keyResidualAbs .atConsume) (.logitLinf .atConsume) :=
  ⟨1, 0, 0, .certified, []⟩

-- `storage >> select`: a storage residual composed directly with a selection stage.
/--
error: Application type mismatch: The argument
  storageStage
has type
  Contract (Metric.keyResidualAbs Site.atConsume) (Metric.keyResidualAbs Site.atConsume)
but is expected to have type
  Contract (Metric.keyResidualAbs Site.atConsume) (Metric.attentionTV Site.atConsume)
in the application
  selectStage.comp storageStage
-/
#guard_msgs in
example : Contract (.keyResidualAbs .atConsume) (.attentionTV .atConsume) :=
  selectStage.comp storageStage

-- `storage >> score` with the storage witness at the write site and the score at consumption.
/--
error: Application type mismatch: The argument
  storageAtWrite
has type
  Contract (Metric.keyResidualAbs Site.atWrite) (Metric.keyResidualAbs Site.atWrite)
but is expected to have type
  Contract (Metric.keyResidualAbs Site.atWrite) (Metric.keyResidualAbs Site.atConsume)
in the application
  scoreStage.comp storageAtWrite
-/
#guard_msgs in
example : Contract (.keyResidualAbs .atWrite) (.logitLinf .atConsume) :=
  scoreStage.comp storageAtWrite

-- Two metrics with the same carrier (`Rat`) are still different types of contract.
/--
error: Type mismatch
  storageStage
has type
  Contract (Metric.keyResidualAbs Site.atConsume) (Metric.keyResidualAbs Site.atConsume)
but is expected to have type
  Contract (Metric.attentionTV Site.atConsume) (Metric.attentionTV Site.atConsume)
-/
#guard_msgs in
example : Contract (.attentionTV .atConsume) (.attentionTV .atConsume) := storageStage

-- The same metric at two sites is two types.
/--
error: Type mismatch
  storageStage
has type
  Contract (Metric.keyResidualAbs Site.atConsume) (Metric.keyResidualAbs Site.atConsume)
but is expected to have type
  Contract (Metric.keyResidualAbs Site.atWrite) (Metric.keyResidualAbs Site.atWrite)
-/
#guard_msgs in
example : Contract (.keyResidualAbs .atWrite) (.keyResidualAbs .atWrite) := storageStage

end IllTyped

end WitCert

end
