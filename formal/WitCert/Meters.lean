/-
Formal companion of `witcert_calculus.meters`.
-/
module

public import WitCert.Analytic

public section

/-!
# The WitCert attention meters

Soundness of the meters of `witcert_calculus.meters`, over the abstract ordered field `α` of
`WitCert.Analytic` with an exponential (and, for the sampling meters, a logarithm) given by laws.

## Main definitions

* `WitCert.Meters.aPlus`: the meter's `A = Σ_t p̃_t e^{c_t}`.
* `WitCert.Meters.aMinus`: the meter's `A⁻ = Σ_t p̃_t e^{−c_t}`.
* `WitCert.Meters.retentionTerm`, `WitCert.Meters.retentionCore`: the retention meter's
  per-token weight and its algebraic core, evaluated by the generated checks.

## Main statements

* `WitCert.Meters.tv_eform_sound`: `|z_t − z̃_t| ≤ c_t` gives `TV ≤ ½ (A² − 1)`.
* `WitCert.Meters.tv_two_sided_sound`: the same hypotheses give `TV ≤ ½ (A/A⁻ − A⁻/A)`.
* `WitCert.Meters.tv_retention_sound`: the per-token retention form
  `TV ≤ ½ Σ_t p̃_t min(A e^{c_t} − 1, max(e^{c_t}/A⁻ − 1, 1 − e^{−c_t}/A))`.
* `WitCert.Meters.tv_retention_core_sound`: the retention form with the weights the meter
  computes, as `retentionCore` (from `tv_retention_sound`, `retentionTerm_meets` and
  `retentionCore_map`).
* `WitCert.Meters.tv_single_token`: a row with one visible token has `TV = 0`, whatever the
  logit errors (softmax over `[t]` is `1` for both `z` and `z̃`).
* `WitCert.Meters.page_in_decrease`: paging in a block with block-constant bound `u` lowers `A`
  by exactly `mass · (e^u − 1)`.
* `WitCert.Meters.sentinel_rounds_sound`: `n ≥ log δ / log q` rounds give `q^n ≤ δ`.
* `WitCert.Meters.rate_upper_bound_sound`: a rate above `ln(1/δ)/n` shows zero failures in `n`
  trials with probability `< δ`.

## Implementation notes

`p = softmax z` is the exact attention and `p̃ = softmax z̃` the attention from compressed keys,
over the tokens of a nonempty list `L`. The laws assumed are those of `WitCert.Analytic.ExpLaws`
and `WitCert.Analytic.ExpLogLaws`, which `Real.exp` and `Real.log` satisfy. The per-band
Cauchy–Schwarz logit bound is in `WitCert/Witness.lean` (squared norms over `Rat`) and the
output-error bound for vector values in `WitCert/Output.lean` (with the laws of a norm).

Each theorem keeps the section's whole carrier context, classes its proof does not use
included: they are part of its statement as exported and locked (`formal/statements.lock.json`).
Where one goes unused, the `unusedSectionVars` linter is switched off for that theorem alone
(`set_option ... in`) instead of omitting the class, which would change the statement.
-/

namespace WitCert.Meters

open WitCert.Analytic

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

attribute [local instance] Lean.Grind.Semiring.natCast

/-- The meter's `A = Σ_t p̃_t e^{c_t}` with `p̃ = softmax z̃`. -/
@[expose] noncomputable def aPlus {β : Type} (E : ExpLaws α) (z' c : β → α) (L : List β) : α :=
  lsum (fun t => softmax E z' L t * E.exp (c t)) L

/-- The meter's `A⁻ = Σ_t p̃_t e^{−c_t}` with `p̃ = softmax z̃`. -/
@[expose] noncomputable def aMinus {β : Type} (E : ExpLaws α) (z' c : β → α) (L : List β) : α :=
  lsum (fun t => softmax E z' L t * E.exp (-(c t))) L

theorem absA_nonneg (x : α) : 0 ≤ absA x := by
  unfold absA; split <;> grind

section Softmax

variable {β : Type} (E : ExpLaws α) (z z' c : β → α) (L : List β)

theorem exp_le_exp_mul_of_absA (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t) :
    ∀ t ∈ L, E.exp (z t) ≤ E.exp (c t) * E.exp (z' t) := by
  intro t ht
  have h := le_of_absA_le (hc t ht)
  rw [← E.exp_add]
  exact E.exp_le_exp (by grind)

theorem exp_le_exp_mul_of_absA' (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t) :
    ∀ t ∈ L, E.exp (z' t) ≤ E.exp (c t) * E.exp (z t) := by
  intro t ht
  have h := le_of_absA_le (hc t ht)
  rw [← E.exp_add]
  exact E.exp_le_exp (by grind)

theorem one_le_exp_of_absA (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t) :
    ∀ t ∈ L, 1 ≤ E.exp (c t) := by
  intro t ht
  have h1 := hc t ht
  have h2 := absA_nonneg (z t - z' t)
  have h3 := E.one_add_le_exp (c t)
  grind

set_option linter.unusedSectionVars false in
theorem aPlus_eq : aPlus E z' c L =
    meterA (fun t => E.exp (z' t)) (fun t => E.exp (c t)) L := rfl

theorem aMinus_eq : aMinus E z' c L =
    meterAm (fun t => E.exp (z' t)) (fun t => E.exp (c t)) L := by
  unfold aMinus meterAm softmax
  apply lsum_congr
  intro t _
  have h1 := E.exp_mul_exp_neg (c t)
  have h2 := E.exp_pos (c t)
  grind

theorem aPlus_pos (hL : L ≠ []) : 0 < aPlus E z' c L := by
  have hV : 0 < lsum (fun s => E.exp (z' s)) L := lsum_pos hL (fun t _ => E.exp_pos _)
  exact lsum_pos hL (fun t _ => Lean.Grind.OrderedRing.mul_pos
    (div_pos_of_pos (E.exp_pos _) hV) (E.exp_pos _))

/-- Soundness of the e-form meter: if every logit error is bounded, `|z_t − z̃_t| ≤ c_t`, then
`TV(softmax z, softmax z̃) ≤ ½ (A² − 1)` with `A = Σ_t p̃_t e^{c_t}`.
Python: `meters.tv_eform`. -/
theorem tv_eform_sound (hL : L ≠ []) (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t) :
    tv (softmax E z L) (softmax E z' L) L ≤
      (1 / 2) * (aPlus E z' c L * aPlus E z' c L - 1) :=
  softmax_tv_eform_general E z z' c L hL hc

/-- Soundness of the two-sided meter: under the hypotheses of `tv_eform_sound`,
`TV ≤ ½ (A/A⁻ − A⁻/A)` with `A⁻ = Σ_t p̃_t e^{−c_t}`. Python: `meters.tv_two_sided`. -/
theorem tv_two_sided_sound (hL : L ≠ []) (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t) :
    tv (softmax E z L) (softmax E z' L) L ≤
      (1 / 2) * (aPlus E z' c L / aMinus E z' c L - aMinus E z' c L / aPlus E z' c L) := by
  have h := tv_le_two_sided_of_ratio (fun t => E.exp (z t)) (fun t => E.exp (z' t))
    (fun t => E.exp (c t)) L hL (fun _ _ => E.exp_pos _) (fun _ _ => E.exp_pos _)
    (one_le_exp_of_absA E z z' c L hc) (exp_le_exp_mul_of_absA E z z' c L hc)
    (exp_le_exp_mul_of_absA' E z z' c L hc)
  rw [← aPlus_eq, ← aMinus_eq] at h
  exact h

/-- Soundness of the per-token retention meter: under the hypotheses of `tv_eform_sound`, for
any per-token weights `b_t ≥ min(A e^{c_t} − 1, max(e^{c_t}/A⁻ − 1, 1 − e^{−c_t}/A))` (in
particular for `b_t` equal to that minimum), `TV ≤ ½ Σ_t p̃_t b_t`. The meter
`min(1, one-sided, two-sided)` of `meters.tv_meter` is the minimum of sound bounds.
Python: the retention form in `meters.tv_meter`. -/
theorem tv_retention_sound (b : β → α) (hL : L ≠ [])
    (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t)
    (hb : ∀ t ∈ L, aPlus E z' c L * E.exp (c t) - 1 ≤ b t ∨
      (E.exp (c t) / aMinus E z' c L - 1 ≤ b t ∧
        1 - E.exp (-(c t)) / aPlus E z' c L ≤ b t)) :
    tv (softmax E z L) (softmax E z' L) L ≤
      (1 / 2) * lsum (fun t => softmax E z' L t * b t) L := by
  have hA := aPlus_pos E z' c L hL
  exact tv_le_retention_of_ratio (fun t => E.exp (z t)) (fun t => E.exp (z' t))
    (fun t => E.exp (c t)) b L hL (fun _ _ => E.exp_pos _) (fun _ _ => E.exp_pos _)
    (fun _ _ => E.exp_pos _) (exp_le_exp_mul_of_absA E z z' c L hc)
    (exp_le_exp_mul_of_absA' E z z' c L hc) (fun t ht => by
      have e1 := E.exp_mul_exp_neg (c t)
      have e2 := E.exp_pos (c t)
      have hne : E.exp (c t) * aPlus E z' c L ≠ 0 := by
        have := Lean.Grind.OrderedRing.mul_pos e2 hA
        grind
      have e3 : 1 / (E.exp (c t) * aPlus E z' c L) = E.exp (-(c t)) / aPlus E z' c L := by
        grind
      rcases hb t ht with h1 | ⟨h2, h3⟩
      · rw [aPlus_eq] at h1
        exact Or.inl h1
      · rw [aMinus_eq] at h2
        rw [← e3, aPlus_eq] at h3
        exact Or.inr ⟨h2, h3⟩)

/-- The retention meter's per-token weight `min (A x − 1) (max (x / A⁻ − 1) (1 − y / A))` at
`x = e^{c_t}`, `y = e^{−c_t}`, for a field with decidable order (`Rat`: the generated checks
evaluate it). Python: `tv_forms._retention_raw`'s `per`. -/
@[expose] def retentionTerm {γ : Type} [Lean.Grind.Field γ] [LE γ] [DecidableLE γ]
    (A Am x y : γ) : γ :=
  let one := A * x - 1
  let two := if x / Am - 1 ≤ 1 - y / A then 1 - y / A else x / Am - 1
  if one ≤ two then one else two

/-- The retention meter's algebraic core `½ Σ_t p_t · retentionTerm A A⁻ x_t y_t` over the
triples `(p_t, x_t, y_t)`. Python: `tv_forms._retention_raw`. -/
@[expose] def retentionCore {γ : Type} [Lean.Grind.Field γ] [LE γ] [DecidableLE γ]
    (A Am : γ) : List (γ × γ × γ) → γ
  | [] => 0
  | t :: ts => (1 / 2) * (t.1 * retentionTerm A Am t.2.1 t.2.2) + retentionCore A Am ts

-- An algebraic identity: the section's order classes are not needed.
set_option linter.unusedSectionVars false in
/-- The core over the triples of a list of tokens is `½ Σ_t p_t · retentionTerm …`. -/
theorem retentionCore_map [DecidableLE α] (A Am : α) (f : β → α × α × α) (L : List β) :
    retentionCore A Am (L.map f) =
      (1 / 2) * lsum (fun t => (f t).1 * retentionTerm A Am (f t).2.1 (f t).2.2) L := by
  induction L with
  | nil => simp only [List.map_nil, retentionCore, lsum]; grind
  | cons x L ih => simp only [List.map_cons, retentionCore, lsum]; rw [ih]; grind

/-- `retentionTerm` meets the hypothesis of `tv_retention_sound`: it is the one-sided weight,
or at least both two-sided ones. -/
theorem retentionTerm_meets [DecidableLE α] (A Am x y : α) :
    A * x - 1 ≤ retentionTerm A Am x y ∨
      (x / Am - 1 ≤ retentionTerm A Am x y ∧ 1 - y / A ≤ retentionTerm A Am x y) := by
  unfold retentionTerm
  simp only
  split <;> split <;> grind

/-- `tv_retention_sound` with the weights the Python meter computes: `TV ≤ retentionCore A A⁻`
over the triples `(p̃_t, e^{c_t}, e^{−c_t})`. -/
theorem tv_retention_core_sound [DecidableLE α] (hL : L ≠ [])
    (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t) :
    tv (softmax E z L) (softmax E z' L) L ≤
      retentionCore (aPlus E z' c L) (aMinus E z' c L)
        (L.map fun t => (softmax E z' L t, E.exp (c t), E.exp (-(c t)))) := by
  rw [retentionCore_map]
  exact tv_retention_sound E z z' c L _ hL hc (fun t _ => retentionTerm_meets _ _ _ _)

/-- Softmax over a single visible token is `1` at that token, whatever its logit. -/
theorem softmax_singleton (t : β) : softmax E z [t] t = 1 := by
  have h := E.exp_pos (z t)
  unfold softmax
  simp only [lsum]
  grind

/-- A single visible token: for `L = [t]` both `softmax z` and `softmax z̃` are `1` at `t`, so
`TV(softmax z, softmax z̃) = 0` for arbitrary logits `z`, `z̃` (no bound on the logit errors is
needed). Python: the single-token rows of `tv_forms` and `witcert_kernels.meter`. -/
theorem tv_single_token (t : β) : tv (softmax E z [t]) (softmax E z' [t]) [t] = 0 := by
  have h1 := softmax_singleton E z t
  have h2 := softmax_singleton E z' t
  unfold tv
  simp only [lsum]
  rw [h1, h2]
  unfold absA; split <;> grind

end Softmax

/-- Paging in one block: if every token of the block (`blk t = true`) has the block-constant
bound `c_t = u`, replacing the block by exact values (bound `0`) lowers
`A = Σ_t p̃_t e^{c_t}` by exactly `mass · (e^u − 1)`, `mass = Σ_{t in block} p̃_t`.
Python: `meters.page_in_order`. -/
theorem page_in_decrease {β : Type} (E : ExpLaws α) (p c : β → α) (blk : β → Bool) (u : α)
    (L : List β) (h : ∀ t ∈ L, blk t = true → c t = u) :
    lsum (fun t => p t * E.exp (c t)) L - lsum (fun t => p t * E.exp (cond (blk t) 0 (c t))) L =
      lsum (fun t => cond (blk t) (p t) 0) L * (E.exp u - 1) := by
  induction L with
  | nil => simp only [lsum]; grind
  | cons x xs ih =>
    have ih' := ih (fun t ht hb => h t (by simp [ht]) hb)
    simp only [lsum]
    cases hx : blk x with
    | false =>
      simp only [cond_false]
      grind
    | true =>
      have hcx := h x (by simp) hx
      have h0 := E.exp_zero
      simp only [cond_true]
      rw [hcx]
      grind

/-! ### Output error -/

set_option linter.unusedSectionVars false in
theorem absA_of_nonneg {a : α} (h : 0 ≤ a) : absA a = a := by
  unfold absA; split <;> grind

theorem absA_of_nonpos {a : α} (h : a ≤ 0) : absA a = -a := by
  unfold absA; split <;> grind

theorem absA_add_le (a b : α) : absA (a + b) ≤ absA a + absA b := by
  unfold absA
  split <;> split <;> split <;> grind

theorem absA_mul_le {a v M : α} (h : absA v ≤ M) : absA (a * v) ≤ absA a * M := by
  have ⟨h1, h2⟩ := le_of_absA_le h
  apply absA_le
  · rcases Std.le_total (a := 0) (b := a) with ha | ha
    · have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h1 ha
      rw [absA_of_nonneg ha]; grind
    · have := Lean.Grind.OrderedRing.mul_le_mul_of_nonpos_left h2 ha
      rw [absA_of_nonpos ha]; grind
  · rcases Std.le_total (a := 0) (b := a) with ha | ha
    · have := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left h2 ha
      rw [absA_of_nonneg ha]; grind
    · have := Lean.Grind.OrderedRing.mul_le_mul_of_nonpos_left h1 ha
      rw [absA_of_nonpos ha]; grind

set_option linter.unusedSectionVars false in
theorem lsum_sub {β : Type} (f g : β → α) (L : List β) :
    lsum (fun t => f t - g t) L = lsum f L - lsum g L := by
  induction L with
  | nil => simp only [lsum]; grind
  | cons x xs ih => simp only [lsum, ih]; grind

theorem absA_lsum_le {β : Type} (f : β → α) (L : List β) :
    absA (lsum f L) ≤ lsum (fun t => absA (f t)) L := by
  induction L with
  | nil => simp only [lsum]; unfold absA; split <;> grind
  | cons x xs ih =>
    simp only [lsum]
    have := absA_add_le (f x) (lsum f xs)
    grind

/-- Output bound for scalar values: with exact values `v_t`, reconstructed values `w_t`,
`|v_t| ≤ M` and `|v_t − w_t| ≤ ρ_t`, the attention outputs `y = Σ p_t v_t` and
`ŷ = Σ p̃_t w_t` satisfy `|y − ŷ| ≤ 2 · TV(p, p̃) · M + Σ_t p̃_t ρ_t`. Python:
`meters.output_error_bound`, which applies the same argument with the Euclidean norm of vector
values in place of `|·|`; only the scalar case is proved here. -/
theorem output_error_bound_sound {β : Type} (p q v w ρ : β → α) (L : List β) (M : α)
    (hM : ∀ t ∈ L, absA (v t) ≤ M) (hρ : ∀ t ∈ L, absA (v t - w t) ≤ ρ t)
    (hq : ∀ t ∈ L, 0 ≤ q t) :
    absA (lsum (fun t => p t * v t) L - lsum (fun t => q t * w t) L) ≤
      2 * tv p q L * M + lsum (fun t => q t * ρ t) L := by
  rw [← lsum_sub]
  have h1 := absA_lsum_le (fun t => p t * v t - q t * w t) L
  have h2 : lsum (fun t => absA (p t * v t - q t * w t)) L ≤
      lsum (fun t => M * absA (p t - q t) + q t * ρ t) L := by
    apply lsum_le
    intro t ht
    have e : p t * v t - q t * w t = (p t - q t) * v t + q t * (v t - w t) := by grind
    rw [e]
    have a1 := absA_add_le ((p t - q t) * v t) (q t * (v t - w t))
    have a2 := absA_mul_le (a := p t - q t) (hM t ht)
    have a3 := absA_mul_le (a := q t) (hρ t ht)
    rw [absA_of_nonneg (hq t ht)] at a3
    grind
  rw [lsum_add, lsum_mul_left] at h2
  unfold tv
  grind

section Log

variable (E : ExpLogLaws α)

set_option linter.unusedSectionVars false in
/-- `q^n = exp (n log q)` for `q > 0`. -/
theorem pow_eq_exp_mul_log {q : α} (hq : 0 < q) (n : Nat) :
    q ^ n = E.exp ((n : α) * E.log q) := by
  induction n with
  | zero =>
    have hc : ((0 : Nat) : α) = 0 := Lean.Grind.Semiring.natCast_zero
    have h0 : E.exp (((0 : Nat) : α) * E.log q) = 1 := by
      rw [show ((0 : Nat) : α) * E.log q = 0 by grind]
      exact E.exp_zero
    have hp : q ^ 0 = 1 := Lean.Grind.Semiring.pow_zero _
    rw [hp]
    grind
  | succ n ih =>
    have hc : ((n + 1 : Nat) : α) = (n : α) + 1 := Lean.Grind.Semiring.natCast_succ n
    have he := E.exp_add ((n : α) * E.log q) (E.log q)
    rw [show (n : α) * E.log q + E.log q = ((n + 1 : Nat) : α) * E.log q by grind] at he
    have hl := E.exp_log q hq
    have hp : q ^ (n + 1) = q ^ n * q := Lean.Grind.Semiring.pow_succ _ _
    rw [hp]
    grind

/-- Sampling sentinel: with `q < 1` the probability that one round misses every corrupted slot,
`n ≥ log δ / log q` rounds (in particular `n = ⌈log δ / log q⌉`) miss with probability
`q^n ≤ δ`. Python: `meters.sentinel_rounds`, with `q = (1 − B/M)^r` for `r` draws with
replacement. -/
theorem sentinel_rounds_sound {q δ : α} (n : Nat) (hq0 : 0 < q) (hq1 : q < 1) (hδ : 0 < δ)
    (hn : E.log δ / E.log q ≤ (n : α)) : q ^ n ≤ δ := by
  have hlq : E.log q < 0 := Classical.byContradiction fun h => by
    have h1 : 0 ≤ E.log q := by grind
    have h2 := E.toExpLaws.exp_le_exp h1
    rw [E.exp_zero, E.exp_log q hq0] at h2
    grind
  have h1 := Lean.Grind.OrderedRing.mul_le_mul_of_nonpos_right hn (Std.le_of_lt hlq)
  have h2 : E.log δ / E.log q * E.log q = E.log δ := by grind
  have h3 := E.toExpLaws.exp_le_exp (show (n : α) * E.log q ≤ E.log δ by grind)
  rw [← pow_eq_exp_mul_log E hq0, E.exp_log δ hδ] at h3
  exact h3

/-- Coverage confidence: if the failure rate `p` exceeds `ln(1/δ)/n`, then zero failures in `n`
independent trials has probability `(1 − p)^n < δ`; so zero observed failures bound the rate by
`ln(1/δ)/n` with confidence `1 − δ`. Python: `meters.rate_upper_bound`. -/
theorem rate_upper_bound_sound {p δ : α} (n : Nat) (hn : 0 < n) (hp0 : 0 ≤ p) (hp1 : p ≤ 1)
    (hδ : 0 < δ) (h : E.log (1 / δ) / (n : α) < p) : (1 - p) ^ n < δ := by
  have hn' : (0 : α) < (n : α) := Lean.Grind.OrderedRing.pos_natCast_of_pos n hn
  have h1 := one_sub_pow_le_exp E.toExpLaws hp0 hp1 n
  have h2 := Lean.Grind.OrderedRing.mul_lt_mul_of_pos_left h hn'
  have h3 : (n : α) * (E.log (1 / δ) / (n : α)) = E.log (1 / δ) := by grind
  have h4 := E.toExpLaws.exp_lt_exp (show -((n : α) * p) < -(E.log (1 / δ)) by grind)
  have h5 := E.toExpLaws.exp_mul_exp_neg (E.log (1 / δ))
  have h6 := E.exp_log (1 / δ) (div_pos_of_pos (by grind) hδ)
  have h7 : E.exp (-(E.log (1 / δ))) = δ := by grind
  grind

end Log

end WitCert.Meters

end
