/-
Formal companion of `witcert_calculus.meters.output_error_bound` for vector values.
-/
module

public import WitCert.Analytic

@[expose] public section

/-!
# The attention-output error bound for vector values

## Main definitions

* `WitCert.Output.NormedLaws`: an explicit structure of laws for a type `V` of value vectors
  over the carrier `α`: addition, zero, negation, subtraction, scalar multiplication, a norm
  `V → α`, the vector-space identities used, `‖v‖ ≥ 0`, the triangle inequality and
  `‖c • v‖ = |c| ‖v‖`.
* `WitCert.Output.NormedLaws.vsum`: the sum of `f t` over a list of tokens, in `V`.

## Main statements

* `WitCert.Meters.output_error_bound_vector_sound`: with `‖v_t‖ ≤ M`, `‖v_t − w_t‖ ≤ ρ_t` and
  `q ≥ 0`, `‖Σ_t p_t • v_t − Σ_t q_t • w_t‖ ≤ 2 · TV(p, q) · M + Σ_t q_t ρ_t`.

## Implementation notes

The carrier `α` is that of `WitCert.Analytic` (core's ordered-field classes). The value space
is not a type class instance but a value `N : NormedLaws α V` whose fields are the operations
and the laws used; no `axiom` is declared. Every real normed space (in particular `ℝⁿ` with the
Euclidean norm, the norm of `meters.output_error_bound`) satisfies each law: they are the
additive-group and distributivity axioms of a vector space and the axioms of a norm (standard).
The scalar form `WitCert.Meters.output_error_bound_sound` is the case `V = α`, `‖x‖ = |x|`.

Each theorem keeps the section's whole carrier context, classes its proof does not use
included: they are part of its statement as exported and locked (`formal/statements.lock.json`).
Where one goes unused, the `unusedSectionVars` linter is switched off for that theorem alone
(`set_option ... in`) instead of omitting the class, which would change the statement.
-/

namespace WitCert.Output

open WitCert.Analytic

/-- Laws of a normed vector space `V` over the ordered field `α`. Every real normed space
satisfies each field (standard: the additive-group and distributivity axioms of a vector space
with `u − v = u + (−v)`, and the norm axioms `‖v‖ ≥ 0`, `‖u + v‖ ≤ ‖u‖ + ‖v‖`,
`‖c • v‖ = |c| ‖v‖`). -/
structure NormedLaws (α : Type) [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
    [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α] (V : Type) where
  /-- Vector addition. -/
  add : V → V → V
  /-- The zero vector. -/
  zero : V
  /-- Negation. -/
  neg : V → V
  /-- Subtraction. -/
  sub : V → V → V
  /-- Scalar multiplication `c • v`. -/
  smul : α → V → V
  /-- The norm `‖v‖`. -/
  norm : V → α
  /-- `(u + v) + w = u + (v + w)`. -/
  add_assoc : ∀ u v w : V, add (add u v) w = add u (add v w)
  /-- `u + v = v + u`. -/
  add_comm : ∀ u v : V, add u v = add v u
  /-- `0 + v = v`. -/
  zero_add : ∀ v : V, add zero v = v
  /-- `−v + v = 0`. -/
  neg_add_cancel : ∀ v : V, add (neg v) v = zero
  /-- `u − v = u + (−v)`. -/
  sub_eq_add_neg : ∀ u v : V, sub u v = add u (neg v)
  /-- `c • (u + v) = c • u + c • v`. -/
  smul_add : ∀ (c : α) (u v : V), smul c (add u v) = add (smul c u) (smul c v)
  /-- `(a + b) • v = a • v + b • v`. -/
  add_smul : ∀ (a b : α) (v : V), smul (a + b) v = add (smul a v) (smul b v)
  /-- `‖v‖ ≥ 0`. -/
  norm_nonneg : ∀ v : V, 0 ≤ norm v
  /-- The triangle inequality `‖u + v‖ ≤ ‖u‖ + ‖v‖`. -/
  norm_add_le : ∀ u v : V, norm (add u v) ≤ norm u + norm v
  /-- Homogeneity `‖c • v‖ = |c| ‖v‖`. -/
  norm_smul : ∀ (c : α) (v : V), norm (smul c v) = absA c * norm v

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

set_option linter.unusedSectionVars false in
/-- `|a| = a` for `a ≥ 0`. -/
theorem absA_self_of_nonneg {a : α} (h : 0 ≤ a) : absA a = a := by
  unfold absA; split <;> grind

/-- `|a| ≥ 0`. -/
theorem zero_le_absA (a : α) : 0 ≤ absA a := by
  unfold absA; split <;> grind

namespace NormedLaws

variable {V : Type} (N : NormedLaws α V)

theorem add_zero (v : V) : N.add v N.zero = v := by
  rw [N.add_comm, N.zero_add]

theorem add_neg (v : V) : N.add v (N.neg v) = N.zero := by
  rw [N.add_comm, N.neg_add_cancel]

/-- Uniqueness of the additive inverse: `x + y = 0` gives `y = −x`. -/
theorem eq_neg_of_add_eq_zero {x y : V} (h : N.add x y = N.zero) : y = N.neg x := by
  calc y = N.add N.zero y := (N.zero_add y).symm
    _ = N.add (N.add (N.neg x) x) y := by rw [N.neg_add_cancel]
    _ = N.add (N.neg x) (N.add x y) := N.add_assoc _ _ _
    _ = N.neg x := by rw [h, N.add_zero]

/-- An idempotent vector is zero: `x + x = x` gives `x = 0`. -/
theorem eq_zero_of_add_self {x : V} (h : N.add x x = x) : x = N.zero := by
  calc x = N.add N.zero x := (N.zero_add x).symm
    _ = N.add (N.add (N.neg x) x) x := by rw [N.neg_add_cancel]
    _ = N.add (N.neg x) (N.add x x) := N.add_assoc _ _ _
    _ = N.zero := by rw [h, N.neg_add_cancel]

theorem smul_zero (c : α) : N.smul c N.zero = N.zero := by
  apply N.eq_zero_of_add_self
  rw [← N.smul_add, N.zero_add]

theorem smul_neg (c : α) (w : V) : N.smul c (N.neg w) = N.neg (N.smul c w) := by
  apply N.eq_neg_of_add_eq_zero
  rw [← N.smul_add, N.add_neg, N.smul_zero]

theorem neg_zero : N.neg N.zero = N.zero := by
  symm
  apply N.eq_neg_of_add_eq_zero
  rw [N.zero_add]

theorem neg_add (a b : V) : N.neg (N.add a b) = N.add (N.neg a) (N.neg b) := by
  symm
  apply N.eq_neg_of_add_eq_zero
  rw [N.add_comm (N.neg a) (N.neg b), N.add_assoc a b (N.add (N.neg b) (N.neg a)),
    ← N.add_assoc b (N.neg b) (N.neg a), N.add_neg b, N.zero_add, N.add_neg a]

/-- `(a + b) − (c + d) = (a − c) + (b − d)`. -/
theorem sub_add_add (a b c d : V) :
    N.sub (N.add a b) (N.add c d) = N.add (N.sub a c) (N.sub b d) := by
  rw [N.sub_eq_add_neg (N.add a b), N.sub_eq_add_neg a c, N.sub_eq_add_neg b d, N.neg_add,
    N.add_assoc a b (N.add (N.neg c) (N.neg d)), N.add_assoc a (N.neg c) (N.add b (N.neg d)),
    ← N.add_assoc b (N.neg c) (N.neg d), N.add_comm b (N.neg c),
    N.add_assoc (N.neg c) b (N.neg d)]

/-- The per-token split `a • u − b • w = (a − b) • u + b • (u − w)`. -/
theorem smul_sub_smul (a b : α) (u w : V) :
    N.sub (N.smul a u) (N.smul b w) = N.add (N.smul (a - b) u) (N.smul b (N.sub u w)) := by
  rw [N.sub_eq_add_neg (N.smul a u), N.sub_eq_add_neg u w, N.smul_add, N.smul_neg,
    ← N.add_assoc (N.smul (a - b) u) (N.smul b u) (N.neg (N.smul b w)), ← N.add_smul]
  have h : a - b + b = a := by grind
  exact congrArg (fun c => N.add (N.smul c u) (N.neg (N.smul b w))) h.symm

theorem norm_zero : N.norm N.zero = 0 := by
  have h := N.norm_smul 0 N.zero
  rw [N.smul_zero] at h
  have h0 : absA (0 : α) = 0 := absA_self_of_nonneg (by grind)
  grind

/-- The sum of `f t` over the tokens `t` of the list `L`, in `V`. -/
def vsum {β : Type} (f : β → V) : List β → V
  | [] => N.zero
  | x :: xs => N.add (f x) (vsum f xs)

theorem vsum_sub {β : Type} (f g : β → V) (L : List β) :
    N.sub (N.vsum f L) (N.vsum g L) = N.vsum (fun t => N.sub (f t) (g t)) L := by
  induction L with
  | nil =>
    simp only [vsum]
    rw [N.sub_eq_add_neg, N.neg_zero, N.zero_add]
  | cons x xs ih =>
    simp only [vsum]
    rw [N.sub_add_add, ih]

/-- The triangle inequality for sums: `‖Σ_t f t‖ ≤ Σ_t ‖f t‖`. -/
theorem norm_vsum_le {β : Type} (f : β → V) (L : List β) :
    N.norm (N.vsum f L) ≤ lsum (fun t => N.norm (f t)) L := by
  induction L with
  | nil =>
    simp only [vsum, lsum]
    have h := N.norm_zero
    grind
  | cons x xs ih =>
    simp only [vsum, lsum]
    have h := N.norm_add_le (f x) (N.vsum f xs)
    grind

end NormedLaws

end WitCert.Output

namespace WitCert.Meters

open WitCert.Analytic WitCert.Output

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

/-- Output bound for vector values: with exact values `v_t`, reconstructed values `w_t` in a
normed space `N`, `‖v_t‖ ≤ M` and `‖v_t − w_t‖ ≤ ρ_t` for the tokens of `L`, and weights
`q_t ≥ 0`, the attention outputs `y = Σ_t p_t • v_t` and `ŷ = Σ_t q_t • w_t` satisfy
`‖y − ŷ‖ ≤ 2 · TV(p, q) · M + Σ_t q_t ρ_t`. Python: `meters.output_error_bound` (Euclidean
norm). -/
theorem output_error_bound_vector_sound {V β : Type} (N : NormedLaws α V) (p q : β → α)
    (v w : β → V) (ρ : β → α) (L : List β) (M : α)
    (hM : ∀ t ∈ L, N.norm (v t) ≤ M) (hρ : ∀ t ∈ L, N.norm (N.sub (v t) (w t)) ≤ ρ t)
    (hq : ∀ t ∈ L, 0 ≤ q t) :
    N.norm (N.sub (N.vsum (fun t => N.smul (p t) (v t)) L)
        (N.vsum (fun t => N.smul (q t) (w t)) L)) ≤
      2 * tv p q L * M + lsum (fun t => q t * ρ t) L := by
  rw [N.vsum_sub]
  have h1 := N.norm_vsum_le (fun t => N.sub (N.smul (p t) (v t)) (N.smul (q t) (w t))) L
  have h2 : lsum (fun t => N.norm (N.sub (N.smul (p t) (v t)) (N.smul (q t) (w t)))) L ≤
      lsum (fun t => M * absA (p t - q t) + q t * ρ t) L := by
    apply lsum_le
    intro t ht
    rw [N.smul_sub_smul]
    have a1 := N.norm_add_le (N.smul (p t - q t) (v t)) (N.smul (q t) (N.sub (v t) (w t)))
    rw [N.norm_smul (p t - q t), N.norm_smul (q t), absA_self_of_nonneg (hq t ht)] at a1
    have a2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (hM t ht) (zero_le_absA (p t - q t))
    have a3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (hρ t ht) (hq t ht)
    grind
  rw [lsum_add, lsum_mul_left] at h2
  unfold tv
  grind

end WitCert.Meters

end
