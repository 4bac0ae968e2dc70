/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Bridges

/-!
# Band witnesses and the per-band Cauchy–Schwarz logit bound

Mirror of `witcert_calculus.meters.witness`. A key residual `r` is cut into bands; the witness
stored at write time is an upper bound of each band norm `‖r_b‖`. At read time the logit error of a
token obeys `|s ⟨q, r⟩| ≤ c = s Σ_b ‖q_b‖ w_b`: Cauchy–Schwarz in each band, then the triangle
inequality over the bands.

A band is a list of coordinate pairs `(q_c, r_c)` (query and residual coordinates of that band),
so `⟨q, r⟩ = Σ_b dot band_b`.

## Main statements

* `WitCert.Witness.neg_le_and_le_of_mul_self_le`: `d² ≤ x²` and `0 ≤ x` give `-x ≤ d ≤ x`.
* `WitCert.Witness.abs_dot_le`: `|⟨q_b, r_b⟩| ≤ x_b` when `‖q_b‖² ‖r_b‖² ≤ x_b²`, `0 ≤ x_b`.
* `WitCert.Witness.logit_bound_sound`: `|s Σ_b ⟨q_b, r_b⟩| ≤ s Σ_b x_b` for `s ≥ 0`, where each
  `x_b ≥ 0` bounds the product of the two band norms (`‖q_b‖² ‖r_b‖² ≤ x_b²`).
* `WitCert.Witness.logit_bound_sound_of_norms`: the same with `x_b = n_b w_b`, where the band
  norms are bounded separately (`‖q_b‖² ≤ n_b²`, `‖r_b‖² ≤ w_b²`, `n_b, w_b ≥ 0`), as Python's
  `logit_bound` computes `c = s Σ_b n_b w_b`.

## Implementation notes

Norms are stated squared (no square root over `Rat`); the Python side rounds every norm upward,
which makes `n_b`, `w_b` and their products upper bounds of the exact ones.
-/

@[expose] public section

namespace WitCert

namespace Witness

open WitCert.Bridges

/-- `d² ≤ x²` with `0 ≤ x` gives `-x ≤ d ≤ x`: if `d > x ≥ 0` then
`d² - x² = (d - x)(d + x) > 0`, and symmetrically for `d < -x`. -/
theorem neg_le_and_le_of_mul_self_le {d x : Rat} (hx : 0 ≤ x) (h : d * d ≤ x * x) :
    -x ≤ d ∧ d ≤ x := by
  constructor
  · apply Classical.byContradiction
    intro hn
    have h1 : 0 < -d - x := by grind
    have h2 : 0 < -d + x := by grind
    have := Rat.mul_pos h1 h2
    grind
  · apply Classical.byContradiction
    intro hn
    have h1 : 0 < d - x := by grind
    have h2 : 0 < d + x := by grind
    have := Rat.mul_pos h1 h2
    grind

/-- One band: `|⟨q_b, r_b⟩| ≤ x_b` when `‖q_b‖² ‖r_b‖² ≤ x_b²` and `0 ≤ x_b`. -/
theorem abs_dot_le (band : List (Rat × Rat)) {x : Rat} (hx : 0 ≤ x)
    (h : normSqFst band * normSqSnd band ≤ x * x) : abs (dot band) ≤ x := by
  have hcs := dot_sq_le band
  exact abs_le_iff.mpr (neg_le_and_le_of_mul_self_le hx (by grind))

/-- The bands together: `|Σ_b ⟨q_b, r_b⟩| ≤ Σ_b x_b` (triangle inequality over the bands). -/
theorem abs_sum_dot_le (bands : List (List (Rat × Rat) × Rat))
    (hx : ∀ e ∈ bands, 0 ≤ e.2)
    (hb : ∀ e ∈ bands, normSqFst e.1 * normSqSnd e.1 ≤ e.2 * e.2) :
    abs (bands.map fun e => dot e.1).sum ≤ (bands.map fun e => e.2).sum := by
  rw [abs_le_iff]
  induction bands with
  | nil => simp only [List.map_nil, List.sum_nil]; grind
  | cons e bands ih =>
    have ih' := ih (fun f hf => hx f (by simp [hf])) (fun f hf => hb f (by simp [hf]))
    have he := abs_le_iff.mp (abs_dot_le e.1 (hx e (by simp)) (hb e (by simp)))
    simp only [List.map_cons, List.sum_cons]
    constructor <;> grind

/-- The per-band Cauchy–Schwarz logit bound (Tier A): split the query `q` and the key residual
`r` of one token into bands (each band a list of coordinate pairs `(q_c, r_c)`), and let each
`x_b ≥ 0` bound the product of the two band norms, `‖q_b‖² ‖r_b‖² ≤ x_b²`. Then for an attention
scale `s ≥ 0`, the logit error `s ⟨q, r⟩ = s Σ_b ⟨q_b, r_b⟩` obeys
`|s ⟨q, r⟩| ≤ s Σ_b x_b`. Python: `witness.logit_bound`, `witness.logit_linf_reading`. -/
theorem logit_bound_sound (bands : List (List (Rat × Rat) × Rat)) {s : Rat} (hs : 0 ≤ s)
    (hx : ∀ e ∈ bands, 0 ≤ e.2)
    (hb : ∀ e ∈ bands, normSqFst e.1 * normSqSnd e.1 ≤ e.2 * e.2) :
    abs (s * (bands.map fun e => dot e.1).sum) ≤ s * (bands.map fun e => e.2).sum := by
  have h := abs_le_iff.mp (abs_sum_dot_le bands hx hb)
  have h1 := Rat.mul_le_mul_of_nonneg_left h.1 hs
  have h2 := Rat.mul_le_mul_of_nonneg_left h.2 hs
  rw [abs_le_iff]
  constructor <;> grind

private theorem sum_sq_nonneg' (l : List (Rat × Rat)) (f : Rat × Rat → Rat) :
    0 ≤ (l.map fun p => f p * f p).sum := by
  induction l with
  | nil => simp only [List.map_nil, List.sum_nil]; grind
  | cons p l ih =>
    simp only [List.map_cons, List.sum_cons]
    have := mul_self_nonneg (f p)
    grind

/-- `‖x‖² ≥ 0`. -/
theorem normSqFst_nonneg (l : List (Rat × Rat)) : 0 ≤ normSqFst l :=
  sum_sq_nonneg' l (fun p => p.1)

/-- `‖y‖² ≥ 0`. -/
theorem normSqSnd_nonneg (l : List (Rat × Rat)) : 0 ≤ normSqSnd l :=
  sum_sq_nonneg' l (fun p => p.2)

/-- The logit bound as Python computes it: each band `(band, n_b, w_b)` carries an upper bound
`n_b ≥ 0` of the query band norm (`‖q_b‖² ≤ n_b²`) and the stored witness `w_b ≥ 0`, an upper
bound of the residual band norm (`‖r_b‖² ≤ w_b²`). Then for `s ≥ 0`,
`|s ⟨q, r⟩| ≤ c = s Σ_b n_b w_b`. Python: `witness.logit_bound`. -/
theorem logit_bound_sound_of_norms (bands : List (List (Rat × Rat) × Rat × Rat)) {s : Rat}
    (hs : 0 ≤ s) (hn : ∀ e ∈ bands, 0 ≤ e.2.1) (hw : ∀ e ∈ bands, 0 ≤ e.2.2)
    (hq : ∀ e ∈ bands, normSqFst e.1 ≤ e.2.1 * e.2.1)
    (hr : ∀ e ∈ bands, normSqSnd e.1 ≤ e.2.2 * e.2.2) :
    abs (s * (bands.map fun e => dot e.1).sum) ≤ s * (bands.map fun e => e.2.1 * e.2.2).sum := by
  have h := logit_bound_sound (bands.map fun e => (e.1, e.2.1 * e.2.2)) hs
    (fun f hf => by
      obtain ⟨e, he, rfl⟩ := List.mem_map.mp hf
      exact Rat.mul_nonneg (hn e he) (hw e he))
    (fun f hf => by
      obtain ⟨e, he, rfl⟩ := List.mem_map.mp hf
      have h1 := Rat.mul_le_mul_of_nonneg_right (hq e he) (normSqSnd_nonneg e.1)
      have h2 := Rat.mul_le_mul_of_nonneg_left (hr e he)
        (Rat.mul_nonneg (hn e he) (hn e he))
      show normSqFst e.1 * normSqSnd e.1 ≤ e.2.1 * e.2.2 * (e.2.1 * e.2.2)
      grind)
  simp only [List.map_map, Function.comp_def] at h
  exact h

end Witness

end WitCert

end
