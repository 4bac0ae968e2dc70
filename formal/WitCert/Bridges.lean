/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Contracts

/-!
# Bridges and local contracts

Mirror of `witcert_calculus.bridges`: the algebraic bridges between metrics and the local
contracts of the memory model (pooling, selection, recurrence), over `Rat`. The softmax-to-TV
bridges need `exp` and live in `WitCert.Analytic`.

Vectors are lists of coordinate pairs `(xᵢ, yᵢ)`, so two vectors always have the same length.

## Main definitions

* `WitCert.Bridges.abs`: absolute value on `Rat`.
* `WitCert.Bridges.dot`, `WitCert.Bridges.normSqFst`, `WitCert.Bridges.normSqSnd`,
  `WitCert.Bridges.normSqSum`.
* `WitCert.Bridges.tv`: total variation `½ Σ |p - q|` of a list of probability pairs.
* `WitCert.Bridges.recurrenceCoeffs`: the composed coefficients of a recurrence.
* `WitCert.Bridges.selectionOffset`: the selection contract's offset `(m_out + m_in) / 2`.

## Main statements

* `WitCert.Bridges.witness_sound`: a residual below its stored witness gives the contract
  `e_out ≤ 0 * e_in + max witness`.
* `WitCert.Bridges.witness_triangle_sound`: on an inexact input, the stored entry's error obeys
  `‖d + r‖² ≤ (1 * e + w)²` when `‖d‖ ≤ e` and `‖r‖ ≤ w`.
* `WitCert.Bridges.score_bridge_sound`: Cauchy–Schwarz, `(s ⟨q, d⟩)² ≤ s² ‖q‖² ‖d‖²`.
* `WitCert.Bridges.pooling_max_caliber`: `|Σ wᵢ eᵢ| ≤ (Σ wᵢ) max |eᵢ|` for `wᵢ ≥ 0`.
* `WitCert.Bridges.pooling_l2_caliber`: `(Σ wᵢ eᵢ)² ≤ (Σ wᵢ²)(Σ eᵢ²)`.
* `WitCert.Bridges.rank_prefix_selection_sound`:
  `TV ≤ ½ (m_out + m_in) + ½ Σ_{I ∩ I'} |p - p'|`; `rank_prefix_selection_offset_sound` states
  it with `selectionOffset`.
* `WitCert.Bridges.rank_prefix_stable`: a margin above `2 ε` keeps the top set.
* `WitCert.Bridges.recurrence_comp_sound`: per-step bounds `e_t ≤ a_t e_{t-1} + b_t` compose to
  `e_T ≤ (Π a_t) e_0 + Σ_t (Π_{s>t} a_s) b_t`.

## Implementation notes

Norms are stated squared (no square root over `Rat`); the Python side rounds the square roots
upward, which keeps each bound sound. The definitions built on list folds are `noncomputable`:
they are evaluated by the kernel, never run (the WebAssembly Lean cannot generate their code).
-/

@[expose] public section

namespace WitCert

namespace Bridges

/-- Absolute value on `Rat`. -/
def abs (x : Rat) : Rat := if 0 ≤ x then x else -x

/-- `⟨x, y⟩ = Σ xᵢ yᵢ` of a list of coordinate pairs. -/
noncomputable def dot (l : List (Rat × Rat)) : Rat := (l.map fun p => p.1 * p.2).sum

/-- `‖x‖² = Σ xᵢ²` of the first coordinates. -/
noncomputable def normSqFst (l : List (Rat × Rat)) : Rat := (l.map fun p => p.1 * p.1).sum

/-- `‖y‖² = Σ yᵢ²` of the second coordinates. -/
noncomputable def normSqSnd (l : List (Rat × Rat)) : Rat := (l.map fun p => p.2 * p.2).sum

/-- `‖x + y‖² = Σ (xᵢ + yᵢ)²`, the squared norm of the sum of the two coordinate vectors. -/
noncomputable def normSqSum (l : List (Rat × Rat)) : Rat :=
  (l.map fun p => (p.1 + p.2) * (p.1 + p.2)).sum

/-- A square is nonnegative. -/
theorem mul_self_nonneg (x : Rat) : 0 ≤ x * x := by
  rcases (Rat.le_total : (0 : Rat) ≤ x ∨ x ≤ 0) with h | h
  · exact Rat.mul_nonneg h h
  · have h' : 0 ≤ -x := by grind
    have := Rat.mul_nonneg h' h'
    grind

/-- The sum of a concatenation is the sum of the sums. -/
theorem sum_append (l m : List Rat) : (l ++ m).sum = l.sum + m.sum := by
  induction l with
  | nil => simp only [List.nil_append, List.sum_nil]; grind
  | cons x l ih => simp only [List.cons_append, List.sum_cons, ih]; grind

/-- `|x| ≤ M` unfolds to two inequalities. -/
theorem abs_le_iff {x M : Rat} : abs x ≤ M ↔ -M ≤ x ∧ x ≤ M := by
  unfold abs
  split <;> constructor <;> intro h <;> grind

/-- `Σ (x yᵢ - y xᵢ)² = x² ‖y‖² - 2 x y ⟨x, y⟩ + y² ‖x‖²`, the step of Lagrange's identity. -/
private theorem sum_sq_cross (l : List (Rat × Rat)) (x y : Rat) :
    (l.map fun p => (x * p.2 - y * p.1) * (x * p.2 - y * p.1)).sum =
      x * x * normSqSnd l - 2 * x * y * dot l + y * y * normSqFst l := by
  induction l with
  | nil => simp only [normSqSnd, normSqFst, dot, List.map_nil, List.sum_nil] <;> grind
  | cons p l ih =>
    simp only [List.map_cons, List.sum_cons, normSqSnd, normSqFst, dot] at ih ⊢
    rw [ih]
    grind

private theorem sum_sq_nonneg (l : List (Rat × Rat)) (f : Rat × Rat → Rat) :
    0 ≤ (l.map fun p => f p * f p).sum := by
  induction l with
  | nil => simp only [List.map_nil, List.sum_nil] <;> grind
  | cons p l ih =>
    simp only [List.map_cons, List.sum_cons]
    have := mul_self_nonneg (f p)
    grind

/-- Cauchy–Schwarz over `Rat`: `⟨x, y⟩² ≤ ‖x‖² ‖y‖²`. -/
theorem dot_sq_le (l : List (Rat × Rat)) : dot l * dot l ≤ normSqFst l * normSqSnd l := by
  induction l with
  | nil => simp only [dot, normSqFst, normSqSnd, List.map_nil, List.sum_nil] <;> grind
  | cons p l ih =>
    have hc := sum_sq_cross l p.1 p.2
    have hn := sum_sq_nonneg l (fun q => p.1 * q.2 - p.2 * q.1)
    simp only [dot, normSqFst, normSqSnd, List.map_cons, List.sum_cons] at ih hc hn ⊢
    grind

/-- The storage witness: if every entry's residual is at most its stored witness and every
witness is at most `w`, the residual obeys the contract `e_out ≤ 0 * e_in + w` for any input
error (Python `witness_contract`, `a = 0`, `b = witness_max`). -/
theorem witness_sound (entries : List (Rat × Rat)) {w : Rat}
    (hr : ∀ p ∈ entries, p.1 ≤ p.2) (hw : ∀ p ∈ entries, p.2 ≤ w) (e : Rat) :
    ∀ p ∈ entries, p.1 ≤ 0 * e + w := by
  intro p hp
  have := hr p hp
  have := hw p hp
  grind

/-- `‖x + y‖² = ‖x‖² + 2 ⟨x, y⟩ + ‖y‖²`. -/
theorem normSqSum_eq (l : List (Rat × Rat)) :
    normSqSum l = normSqFst l + 2 * dot l + normSqSnd l := by
  induction l with
  | nil => simp only [normSqSum, normSqFst, normSqSnd, dot, List.map_nil, List.sum_nil] <;> grind
  | cons p l ih =>
    simp only [normSqSum, normSqFst, normSqSnd, dot, List.map_cons, List.sum_cons] at ih ⊢
    rw [ih]
    grind

/-- The storage witness on an inexact input (Python `witness_contract` and
`latent_witness_contract`, `a = 1`, `b = witness_max`): if the input's error vector (first
coordinates) has norm at most `e` and the stored residual (second coordinates) has norm at most
its witness bound `w`, the stored entry's error, their sum, has norm at most `1 * e + w` (the
triangle inequality, stated with squares: `Rat` has no square root). -/
theorem witness_triangle_sound (l : List (Rat × Rat)) {e w : Rat} (he : 0 ≤ e) (hw : 0 ≤ w)
    (hd : normSqFst l ≤ e * e) (hr : normSqSnd l ≤ w * w) :
    normSqSum l ≤ (1 * e + w) * (1 * e + w) := by
  have hs : 0 ≤ normSqSnd l := sum_sq_nonneg l (fun p => p.2)
  have h1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_right hd hs
  have h2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hr (mul_self_nonneg e)
  have hc := dot_sq_le l
  have hew : 0 ≤ e * w := Lean.Grind.OrderedRing.mul_nonneg he hw
  have hdot : dot l ≤ e * w := by
    by_cases h : dot l ≤ e * w
    · exact h
    · have hp : 0 < dot l - e * w := by grind
      have hq : 0 < dot l + e * w := by grind
      have := Lean.Grind.OrderedRing.mul_pos hp hq
      grind
  rw [normSqSum_eq]
  grind

/-- The score bridge (Cauchy–Schwarz): for a query `q` and a key residual `d`, scaled by `s`,
`(s ⟨q, d⟩)² ≤ s² ‖q‖² ‖d‖²`, i.e. `|Δ logit| ≤ s ‖q‖ ‖Δk‖` (Python `score_bridge`,
`a = s · max ‖q‖`). -/
theorem score_bridge_sound (l : List (Rat × Rat)) (s : Rat) :
    (s * dot l) * (s * dot l) ≤ (s * s) * (normSqFst l * normSqSnd l) := by
  have h := dot_sq_le l
  have := Rat.mul_le_mul_of_nonneg_left h (mul_self_nonneg s)
  grind

/-- Pooling, max caliber: with weights `wᵢ ≥ 0` and `|eᵢ| ≤ M`,
`|Σ wᵢ eᵢ| ≤ (Σ wᵢ) M` (Python `pooling(...).max`, `a = ‖w‖₁`, equal to `M` when the weights
sum to `1`). Each pair is `(wᵢ, eᵢ)`. -/
theorem pooling_max_caliber (l : List (Rat × Rat)) {M : Rat} (hw : ∀ p ∈ l, 0 ≤ p.1)
    (he : ∀ p ∈ l, abs p.2 ≤ M) : abs (dot l) ≤ (l.map Prod.fst).sum * M := by
  rw [abs_le_iff]
  induction l with
  | nil => simp only [dot, List.map_nil, List.sum_nil] <;> grind
  | cons p l ih =>
    have ih' := ih (fun q hq => hw q (by simp [hq]))
      (fun q hq => he q (by simp [hq]))
    have hp := abs_le_iff.mp (he p (by simp))
    have hw0 := hw p (by simp)
    have h1 := Rat.mul_le_mul_of_nonneg_left hp.2 hw0
    have h2 := Rat.mul_le_mul_of_nonneg_left hp.1 hw0
    simp only [dot, List.map_cons, List.sum_cons] at ih' ⊢
    constructor <;> grind

/-- Pooling, l2 caliber: `(Σ wᵢ eᵢ)² ≤ (Σ wᵢ²)(Σ eᵢ²)`, i.e. `|Σ wᵢ eᵢ| ≤ ‖w‖₂ ‖e‖₂`
(Python `pooling(...).l2`, `a = ‖w‖₂` rounded up). -/
theorem pooling_l2_caliber (l : List (Rat × Rat)) :
    dot l * dot l ≤ normSqFst l * normSqSnd l :=
  dot_sq_le l

/-- Total variation `½ Σ |pᵢ - qᵢ|` of a list of probability pairs `(pᵢ, qᵢ)`. -/
noncomputable def tv (l : List (Rat × Rat)) : Rat := (l.map fun x => abs (x.1 - x.2)).sum / 2

private theorem sum_abs_sub_zero (l : List Rat) (h : ∀ x ∈ l, 0 ≤ x) :
    ((l.map fun x => (x, (0 : Rat))).map fun x => abs (x.1 - x.2)).sum = l.sum := by
  induction l with
  | nil => rfl
  | cons x l ih =>
    simp only [List.map_cons, List.sum_cons]
    rw [ih (fun y hy => h y (by simp [hy]))]
    have hx := h x (by simp)
    simp only [abs]
    split <;> grind

private theorem sum_abs_zero_sub (l : List Rat) (h : ∀ x ∈ l, 0 ≤ x) :
    ((l.map fun x => ((0 : Rat), x)).map fun x => abs (x.1 - x.2)).sum = l.sum := by
  induction l with
  | nil => rfl
  | cons x l ih =>
    simp only [List.map_cons, List.sum_cons]
    rw [ih (fun y hy => h y (by simp [hy]))]
    have hx := h x (by simp)
    simp only [abs]
    split <;> grind

/-- Rank-prefix selection: the exact weights `p` and the selected, renormalised weights `p'`
split into the entries kept by both (`common`, pairs `(pᵢ, p'ᵢ)`), the entries the selection
dropped (`p' = 0`, total exact mass at most `m_out`) and the entries it brought in (`p = 0`,
total mass at most `m_in`). Then
`TV(p, p') ≤ ½ (m_out + m_in) + ½ Σ_{I ∩ I'} |p - p'|` (Python `rank_prefix_selection`,
`(a, b) = (1, (m_out + m_in) / 2)`). -/
theorem rank_prefix_selection_sound (common : List (Rat × Rat)) (dropped added : List Rat)
    {mOut mIn : Rat} (hd : ∀ x ∈ dropped, 0 ≤ x) (ha : ∀ x ∈ added, 0 ≤ x)
    (hOut : dropped.sum ≤ mOut) (hIn : added.sum ≤ mIn) :
    tv (common ++ dropped.map (fun x => (x, 0)) ++ added.map (fun x => (0, x))) ≤
      (mOut + mIn) / 2 + tv common := by
  simp only [tv, List.map_append, sum_append]
  rw [sum_abs_sub_zero dropped hd, sum_abs_zero_sub added ha]
  grind

/-- The offset `(m_out + m_in) / 2` of the rank-prefix selection contract: Python
`rank_prefix_selection`'s `b`, evaluated by the generated checks. -/
def selectionOffset (mOut mIn : Rat) : Rat := (mOut + mIn) / 2

/-- `rank_prefix_selection_sound` with its offset as `selectionOffset`. -/
theorem rank_prefix_selection_offset_sound (common : List (Rat × Rat)) (dropped added : List Rat)
    {mOut mIn : Rat} (hd : ∀ x ∈ dropped, 0 ≤ x) (ha : ∀ x ∈ added, 0 ≤ x)
    (hOut : dropped.sum ≤ mOut) (hIn : added.sum ≤ mIn) :
    tv (common ++ dropped.map (fun x => (x, 0)) ++ added.map (fun x => (0, x))) ≤
      selectionOffset mOut mIn + tv common :=
  rank_prefix_selection_sound common dropped added hd ha hOut hIn

/-- Rank-prefix stability: if every score moves by at most `ε` and every kept entry's true
score exceeds every dropped entry's by more than `2 ε`, every kept entry still outranks every
dropped entry, so the top set is unchanged (Python `rank_prefix_stable`: rows whose margin
between the `k`-th and `(k+1)`-th score exceeds `2 ε`). -/
theorem rank_prefix_stable {ι : Type} (score score' : ι → Rat) (top : ι → Prop) {ε : Rat}
    (hε : ∀ x, abs (score' x - score x) ≤ ε)
    (hmargin : ∀ x y, top x → ¬ top y → score y + 2 * ε < score x) :
    ∀ x y, top x → ¬ top y → score' y < score' x := by
  intro x y hx hy
  have h1 := abs_le_iff.mp (hε x)
  have h2 := abs_le_iff.mp (hε y)
  have := hmargin x y hx hy
  grind

/-- The composed coefficients `(Π a_t, Σ_t (Π_{s>t} a_s) b_t)` of the steps `(a_t, b_t)`, folded
from `acc` (Python `recurrence`, which starts from `(1, 0)`). -/
noncomputable def recurrenceCoeffs (acc : Rat × Rat) (steps : List (Rat × Rat)) : Rat × Rat :=
  steps.foldl (fun c st => (st.1 * c.1, st.1 * c.2 + st.2)) acc

/-- A trajectory `e₀, e₁, …` obeys the steps `(a_t, b_t)`: `e_t ≤ a_t e_{t-1} + b_t`. Each
element of the list is `(a_t, b_t, e_t)`. -/
def Obeys : Rat → List (Rat × Rat × Rat) → Prop
  | _, [] => True
  | e, (a, b, e') :: l => e' ≤ a * e + b ∧ Obeys e' l

/-- The last error of a trajectory that starts at `e`. -/
def lastError : Rat → List (Rat × Rat × Rat) → Rat
  | e, [] => e
  | _, (_, _, e') :: l => lastError e' l

private theorem recurrence_aux (l : List (Rat × Rat × Rat)) (e₀ : Rat) :
    ∀ (e : Rat) (acc : Rat × Rat), e ≤ acc.1 * e₀ + acc.2 → (∀ x ∈ l, 0 ≤ x.1) → Obeys e l →
      lastError e l ≤ (recurrenceCoeffs acc (l.map fun x => (x.1, x.2.1))).1 * e₀ +
        (recurrenceCoeffs acc (l.map fun x => (x.1, x.2.1))).2 := by
  induction l with
  | nil => intro e acc h _ _; exact h
  | cons x l ih =>
    intro e acc h ha ho
    obtain ⟨a, b, e'⟩ := x
    simp only [Obeys] at ho
    have ha0 : 0 ≤ a := ha (a, b, e') (by simp)
    have hstep : e' ≤ (a * acc.1) * e₀ + (a * acc.2 + b) := by
      have := Rat.mul_le_mul_of_nonneg_left h ha0
      grind
    exact ih e' (a * acc.1, a * acc.2 + b) hstep
      (fun y hy => ha y (by simp [hy])) ho.2

/-- A recurrence composes: per-step bounds `e_t ≤ a_t e_{t-1} + b_t` with `a_t ≥ 0` give
`e_T ≤ A e_0 + B` with `(A, B) = recurrenceCoeffs (1, 0) steps`, i.e. `A = Π a_t` and
`B = Σ_t (Π_{s>t} a_s) b_t` (Python `recurrence`). -/
theorem recurrence_comp_sound (l : List (Rat × Rat × Rat)) (e₀ : Rat)
    (ha : ∀ x ∈ l, 0 ≤ x.1) (ho : Obeys e₀ l) :
    lastError e₀ l ≤ (recurrenceCoeffs (1, 0) (l.map fun x => (x.1, x.2.1))).1 * e₀ +
      (recurrenceCoeffs (1, 0) (l.map fun x => (x.1, x.2.1))).2 :=
  recurrence_aux l e₀ e₀ (1, 0) (by show e₀ ≤ 1 * e₀ + 0; grind) ha ho

end Bridges

end WitCert

end
