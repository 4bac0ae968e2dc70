/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Analytic

public section

/-!
# The sub-Gaussian tail of subtractively dithered quantization error

Formal companion of `witcert_calculus.meters.dither` (the Tier-B certificate).

The dither offset `ξ` of `witcert_calculus.meters.dither` is drawn from the grid `j · 2⁻²⁴ − ½`,
`j < 2²⁴`. With subtractive dither the rounding residual of a channel, in units of the block
scale, is then `V + d`: `V` uniform on the `2²⁴` midpoints `(2j + 1 − 2²⁴) · 2⁻²⁵` of
`[−½, ½]` and `d` a deterministic offset with `|d| ≤ 2⁻²⁵` (half a grid step,
`dither.GRID_MEAN`). This file proves that such a grid variable is sub-Gaussian with the
variance proxy `h²/3` of the continuous uniform on `[−h, h]` (`h = s/2` gives `s²/12`), and the
resulting tail of a token's logit error `Σ_c w_c V_c`.

The proof writes the grid variable as a sum of independent fair signs with dyadic weights
(`V = Σ_{k<K} ± 2^k e`, `signAvg_dyadic`); each sign contributes `cosh (x 2^k e)` to the moment
generating function, and `cosh y ≤ exp (y²/2)` bounds the product by
`exp (x² Σ_k 4^k e² / 2) ≤ exp (x² h² / 6)` (`grid_mgf_le`). Chernoff's method then gives the
tail (`signAvg_abs_tail_le`, `dither_logit_tail`).

## Main definitions

* `WitCert.Dither.CoshLaws`: the exponential laws of `WitCert.Analytic.ExpLaws` together with
  `cosh y ≤ exp (y²/2)`.
* `WitCert.Dither.signAvg`: the average of `f` over the `2ⁿ` sign vectors `{−1, 1}ⁿ`, i.e. the
  expectation over `n` independent fair signs, as a finite tree of draws.
* `WitCert.Dither.dot`, `WitCert.Dither.sumSq`, `WitCert.Dither.rsum`, `WitCert.Dither.ind`.
* `WitCert.Dither.dyadic`: the weights `[2^{K−1} e, …, 2e, e]` of a `2^K`-point grid.
* `WitCert.Dither.channelCoeffs`: the weights of `Σ_c w_c V_c` over all channels.

## Main statements

* `WitCert.Dither.signAvg_dyadic`: `Σ_k ± 2^k e` under fair signs is uniform on the midpoint
  grid `(2j + 1 − 2^K) e`, `j < 2^K`.
* `WitCert.Dither.signAvg_append`: the signs of a concatenated list are independent blocks.
* `WitCert.Dither.signAvg_exp_dot_le`: `E exp (x Σ_k c_k ε_k) ≤ exp (x² Σ_k c_k² / 2)`.
* `WitCert.Dither.grid_mgf_le`: the grid variable's moment generating function is at most
  `exp (x a + x² h² / 6)` with `h = 2^K e` its half-width and `a` a shift.
* `WitCert.Dither.signAvg_tail_le`, `WitCert.Dither.signAvg_abs_tail_le`: Chernoff tails
  `P(Σ c ε ≥ r) ≤ exp (−r²/(2σ²))` and `P(|Σ c ε| ≥ r) ≤ 2 exp (−r²/(2σ²))` for
  `Σ c² ≤ σ²`.
* `WitCert.Dither.dither_logit_tail`: the tail of `Σ_c w_c V_c` with `σ² = h² Σ_c w_c² / 3`.
* `WitCert.Dither.signAvg_union_le`: the union bound over a list of events.

## Implementation notes

The carrier `α` is abstract, as in `WitCert/Analytic.lean`. `CoshLaws` adds one law to
`ExpLaws`: `(exp y + exp (−y))/2 ≤ exp (y·y/2)`, which ℝ satisfies (`Real.cosh_le_exp_half_sq`
with `Real.cosh_eq`, a standard fact). It is not derived from the laws of `ExpLaws`: its
standard proofs use the power series of `exp`. No `axiom` is declared; every theorem takes the
laws as a hypothesis. Probabilities are averages over finite trees of fair signs, so "the
probability of an event" is `signAvg n (fun s => ind (event s))`.
-/

namespace WitCert.Dither

open WitCert.Analytic

/-- The laws of `WitCert.Analytic.ExpLaws` and `cosh y ≤ exp (y²/2)`. The real exponential
satisfies each field (`Real.exp_add`, `Real.exp_zero`, `Real.exp_pos`, `Real.add_one_le_exp`,
and `Real.cosh_le_exp_half_sq` with `Real.cosh_eq`). -/
structure CoshLaws (α : Type) [Lean.Grind.Field α] [LE α] [LT α] extends ExpLaws α where
  /-- `cosh y ≤ exp (y²/2)`, with `cosh y = (exp y + exp (−y))/2`. -/
  cosh_le_exp_half_sq : ∀ y, (exp y + exp (-y)) / 2 ≤ exp (y * y / 2)

attribute [local instance] Lean.Grind.Semiring.natCast

section Algebra

variable {α : Type} [Lean.Grind.Field α]

/-! ### Finite trees of fair signs -/

/-- The average of `f` over the `2ⁿ` sign vectors `s ∈ {−1, 1}ⁿ`: the expectation of `f` over
`n` independent fair signs. -/
@[expose] def signAvg : Nat → (List α → α) → α
  | 0, f => f []
  | n + 1, f => (signAvg n (fun s => f (1 :: s)) + signAvg n (fun s => f (-1 :: s))) / 2

/-- `Σ_k c_k s_k` over the common length of the two lists. -/
@[expose] def dot : List α → List α → α
  | [], _ => 0
  | _ :: _, [] => 0
  | c :: cs, s :: ss => c * s + dot cs ss

/-- `Σ_k c_k²`. -/
@[expose] noncomputable def sumSq (cs : List α) : α := lsum (fun c => c * c) cs

/-- `Σ_{j<n} g j`. -/
@[expose] def rsum (g : Nat → α) : Nat → α
  | 0 => 0
  | n + 1 => rsum g n + g n

/-- The indicator of a proposition: `1` if it holds, `0` otherwise. -/
@[expose] noncomputable def ind (P : Prop) : α :=
  @ite α P (Classical.propDecidable _) 1 0

/-- The weights `[2^{K−1} e, …, 2e, e]`: `Σ_k ± 2^k e` ranges over the `2^K`-point grid. -/
@[expose] def dyadic (e : α) : Nat → List α
  | 0 => []
  | K + 1 => (2 : α) ^ K * e :: dyadic e K

/-- The weights of `Σ_c w_c V_c` where channel `c` is `w_c` times a `2^K`-point grid variable of
half-step `e`: one dyadic block per channel. -/
@[expose] noncomputable def channelCoeffs (e : α) (K : Nat) : List α → List α
  | [] => []
  | w :: ws => dyadic (w * e) K ++ channelCoeffs e K ws

theorem signAvg_succ (n : Nat) (f : List α → α) :
    signAvg (n + 1) f = (signAvg n (fun s => f (1 :: s)) + signAvg n (fun s => f (-1 :: s))) / 2 :=
  rfl

theorem dot_cons_cons (c s : α) (cs ss : List α) : dot (c :: cs) (s :: ss) = c * s + dot cs ss :=
  rfl

theorem sumSq_nil : sumSq ([] : List α) = 0 := rfl

theorem sumSq_cons (c : α) (cs : List α) : sumSq (c :: cs) = c * c + sumSq cs := rfl

theorem signAvg_congr {n : Nat} {f g : List α → α} (h : ∀ s, f s = g s) :
    signAvg n f = signAvg n g := by
  rw [show f = g from funext h]

theorem signAvg_add (n : Nat) (f g : List α → α) :
    signAvg n (fun s => f s + g s) = signAvg n f + signAvg n g := by
  induction n generalizing f g with
  | zero => rfl
  | succ n ih =>
    rw [signAvg_succ, signAvg_succ, signAvg_succ, ih (fun s => f (1 :: s)),
      ih (fun s => f (-1 :: s))]
    grind

/-- Independence of blocks: the signs of a concatenation `s₁ ++ s₂` are a fair-sign vector
`s₁` followed by an independent one `s₂`. -/
theorem signAvg_append (m n : Nat) (f : List α → α) :
    signAvg (m + n) f = signAvg m (fun s₁ => signAvg n (fun s₂ => f (s₁ ++ s₂))) := by
  induction m generalizing f with
  | zero => rw [Nat.zero_add]; rfl
  | succ m ih =>
    rw [Nat.succ_add, signAvg_succ, signAvg_succ, ih (fun s => f (1 :: s)),
      ih (fun s => f (-1 :: s))]
    rfl

/-! ### Lists of weights, natural-number sums -/

theorem length_dyadic (e : α) (K : Nat) : (dyadic e K).length = K := by
  induction K with
  | zero => rfl
  | succ K ih => simp only [dyadic, List.length_cons, ih]

theorem sumSq_append (cs ds : List α) : sumSq (cs ++ ds) = sumSq cs + sumSq ds := by
  induction cs with
  | nil => simp only [List.nil_append, sumSq_nil]; grind
  | cons c cs ih => simp only [List.cons_append, sumSq_cons, ih]; grind

/-- `3 Σ_{k<K} (2^k e)² = (4^K − 1) e²`, written with `4^K = 2^K · 2^K`. -/
theorem sumSq_dyadic (e : α) (K : Nat) :
    3 * sumSq (dyadic e K) = ((2 : α) ^ K * (2 : α) ^ K - 1) * (e * e) := by
  induction K with
  | zero =>
    simp only [dyadic, sumSq_nil]
    rw [Lean.Grind.Semiring.pow_zero]
    grind
  | succ K ih =>
    simp only [dyadic, sumSq_cons]
    rw [Lean.Grind.Semiring.pow_succ]
    grind

theorem dot_neg (cs s : List α) : dot (cs.map (fun c => -c)) s = -dot cs s := by
  induction cs generalizing s with
  | nil => simp only [List.map_nil, dot]; grind
  | cons c cs ih =>
    cases s with
    | nil => simp only [List.map_cons, dot]; grind
    | cons x xs => simp only [List.map_cons, dot, ih]; grind

theorem sumSq_neg (cs : List α) : sumSq (cs.map (fun c => -c)) = sumSq cs := by
  induction cs with
  | nil => rfl
  | cons c cs ih => simp only [List.map_cons, sumSq_cons, ih]; grind

theorem rsum_congr {g h : Nat → α} (n : Nat) (hg : ∀ j, g j = h j) : rsum g n = rsum h n := by
  rw [show g = h from funext hg]

theorem rsum_add (g : Nat → α) (m n : Nat) :
    rsum g (m + n) = rsum g m + rsum (fun i => g (m + i)) n := by
  induction n with
  | zero => simp only [Nat.add_zero, rsum]; grind
  | succ n ih =>
    rw [← Nat.add_assoc]
    simp only [rsum]
    rw [ih]
    grind

theorem natCast_add' (m n : Nat) : ((m + n : Nat) : α) = (m : α) + (n : α) := by
  induction n with
  | zero => rw [Nat.add_zero, Lean.Grind.Semiring.natCast_zero]; grind
  | succ n ih =>
    rw [← Nat.add_assoc, Lean.Grind.Semiring.natCast_succ, Lean.Grind.Semiring.natCast_succ, ih]
    grind

theorem natCast_two_pow (K : Nat) : ((2 ^ K : Nat) : α) = (2 : α) ^ K := by
  induction K with
  | zero =>
    rw [Nat.pow_zero, Lean.Grind.Semiring.pow_zero]
    have h := Lean.Grind.Semiring.natCast_succ (α := α) 0
    rw [Lean.Grind.Semiring.natCast_zero] at h
    grind
  | succ K ih =>
    rw [show 2 ^ (K + 1) = 2 ^ K + 2 ^ K by rw [Nat.pow_succ]; omega, natCast_add', ih,
      Lean.Grind.Semiring.pow_succ]
    grind

theorem ind_pos {P : Prop} (h : P) : (ind P : α) = 1 := by
  unfold ind; rw [if_pos h]

theorem ind_neg {P : Prop} (h : ¬P) : (ind P : α) = 0 := by
  unfold ind; rw [if_neg h]

end Algebra

variable {α : Type} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

theorem two_pos : (0 : α) < 2 := by
  have h := Lean.Grind.OrderedRing.zero_lt_one (R := α)
  grind

theorem mul_self_nonneg' (x : α) : 0 ≤ x * x := by
  rcases Std.le_total (a := x) (b := 0) with h | h
  · have := Lean.Grind.OrderedRing.mul_nonneg (show (0 : α) ≤ -x by grind)
      (show (0 : α) ≤ -x by grind)
    grind
  · exact Lean.Grind.OrderedRing.mul_nonneg h h

theorem signAvg_mono {n : Nat} {f g : List α → α} (h : ∀ s, f s ≤ g s) :
    signAvg n f ≤ signAvg n g := by
  induction n generalizing f g with
  | zero => exact h []
  | succ n ih =>
    rw [signAvg_succ, signAvg_succ]
    have h1 := ih (f := fun s => f (1 :: s)) (g := fun s => g (1 :: s)) (fun s => h _)
    have h2 := ih (f := fun s => f (-1 :: s)) (g := fun s => g (-1 :: s)) (fun s => h _)
    exact div_le_div_of_le two_pos (by grind)

theorem signAvg_const (n : Nat) (c : α) : signAvg n (fun _ => c) = c := by
  induction n with
  | zero => rfl
  | succ n ih => rw [signAvg_succ, ih]; grind

theorem sumSq_dyadic_le (e : α) (K : Nat) :
    3 * sumSq (dyadic e K) ≤ ((2 : α) ^ K * e) * ((2 : α) ^ K * e) := by
  have h := sumSq_dyadic e K
  have he := mul_self_nonneg' e
  grind

theorem sumSq_channelCoeffs_le (e : α) (K : Nat) (ws : List α) :
    3 * sumSq (channelCoeffs e K ws) ≤
      sumSq ws * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) := by
  induction ws with
  | nil => simp only [channelCoeffs, sumSq_nil]; grind
  | cons w ws ih =>
    simp only [channelCoeffs, sumSq_cons]
    rw [sumSq_append]
    have h := sumSq_dyadic_le (w * e) K
    grind

/-! ### Sums of dyadic signs are uniform on a grid -/

/-- `Σ_{k<K} ± 2^k e` with independent fair signs is uniform on the `2^K` midpoints
`(2j + 1 − 2^K) e`, `j < 2^K` (shifted by `a`): for every `f`,
`2^K · E f (a + Σ_k ± 2^k e) = Σ_{j<2^K} f (a + (2j + 1 − 2^K) e)`. With `2^K e = ½` these are
the midpoints of `2^K` equal cells of `[−½, ½]`: the centred dither residual of
`witcert_calculus.meters.dither` for `K = 24`. -/
theorem signAvg_dyadic (f : α → α) (e : α) (K : Nat) (a : α) :
    (2 : α) ^ K * signAvg K (fun s => f (a + dot (dyadic e K) s)) =
      rsum (fun j => f (a + (2 * (j : α) + 1 - (2 : α) ^ K) * e)) (2 ^ K) := by
  induction K generalizing a with
  | zero =>
    rw [Nat.pow_zero]
    simp only [signAvg, dyadic, dot, rsum]
    rw [Lean.Grind.Semiring.pow_zero, Lean.Grind.Semiring.natCast_zero]
    rw [show a + (2 * (0 : α) + 1 - 1) * e = a + 0 by grind]
    grind
  | succ K ih =>
    rw [signAvg_succ]
    simp only [dyadic, dot_cons_cons]
    rw [signAvg_congr (f := fun s => f (a + ((2 : α) ^ K * e * 1 + dot (dyadic e K) s)))
        (g := fun s => f ((a + (2 : α) ^ K * e) + dot (dyadic e K) s))
        (fun s => by dsimp only; rw [show a + ((2 : α) ^ K * e * 1 + dot (dyadic e K) s) =
          (a + (2 : α) ^ K * e) + dot (dyadic e K) s by grind]),
      signAvg_congr (f := fun s => f (a + ((2 : α) ^ K * e * -1 + dot (dyadic e K) s)))
        (g := fun s => f ((a - (2 : α) ^ K * e) + dot (dyadic e K) s))
        (fun s => by dsimp only; rw [show a + ((2 : α) ^ K * e * -1 + dot (dyadic e K) s) =
          (a - (2 : α) ^ K * e) + dot (dyadic e K) s by grind])]
    have hup := ih (a + (2 : α) ^ K * e)
    have hlo := ih (a - (2 : α) ^ K * e)
    have hp : (2 : α) ^ (K + 1) = (2 : α) ^ K * 2 := Lean.Grind.Semiring.pow_succ _ _
    rw [show 2 ^ (K + 1) = 2 ^ K + 2 ^ K by rw [Nat.pow_succ]; omega, rsum_add]
    rw [rsum_congr (2 ^ K) (g := fun j => f (a + (2 * (j : α) + 1 - (2 : α) ^ (K + 1)) * e))
        (h := fun j => f ((a - (2 : α) ^ K * e) + (2 * (j : α) + 1 - (2 : α) ^ K) * e))
        (fun j => by dsimp only; rw [hp, show a + (2 * (j : α) + 1 - (2 : α) ^ K * 2) * e =
          (a - (2 : α) ^ K * e) + (2 * (j : α) + 1 - (2 : α) ^ K) * e by grind])]
    rw [rsum_congr (2 ^ K)
        (g := fun i => f (a + (2 * ((2 ^ K + i : Nat) : α) + 1 - (2 : α) ^ (K + 1)) * e))
        (h := fun i => f ((a + (2 : α) ^ K * e) + (2 * (i : α) + 1 - (2 : α) ^ K) * e))
        (fun i => by dsimp only; rw [hp, natCast_add', natCast_two_pow,
          show a + (2 * ((2 : α) ^ K + (i : α)) + 1 - (2 : α) ^ K * 2) * e =
            (a + (2 : α) ^ K * e) + (2 * (i : α) + 1 - (2 : α) ^ K) * e by grind])]
    rw [← hup, ← hlo, hp]
    grind

/-! ### The moment generating function of fair-sign sums -/

/-- `E exp (x Σ_k c_k ε_k + m) ≤ exp (m + x² Σ_k c_k² / 2)` for independent fair signs `ε_k`:
the product of `cosh (x c_k)` bounded factor by factor with `cosh y ≤ exp (y²/2)`. -/
theorem signAvg_exp_dot_le (E : CoshLaws α) (x m : α) (cs : List α) :
    signAvg cs.length (fun s => E.exp (x * dot cs s + m)) ≤
      E.exp (m + x * x * sumSq cs / 2) := by
  induction cs generalizing m with
  | nil =>
    simp only [List.length_nil, signAvg, dot, sumSq_nil]
    rw [show x * 0 + m = m + x * x * 0 / 2 by grind]
    exact Std.le_refl _
  | cons c cs ih =>
    rw [List.length_cons, signAvg_succ]
    simp only [dot_cons_cons, sumSq_cons]
    rw [signAvg_congr (f := fun s => E.exp (x * (c * 1 + dot cs s) + m))
        (g := fun s => E.exp (x * dot cs s + (m + x * c)))
        (fun s => congrArg E.exp (by grind)),
      signAvg_congr (f := fun s => E.exp (x * (c * -1 + dot cs s) + m))
        (g := fun s => E.exp (x * dot cs s + (m + -(x * c))))
        (fun s => congrArg E.exp (by grind))]
    have h1 := ih (m + x * c)
    have h2 := ih (m + -(x * c))
    have e1 := E.exp_add (m + x * x * sumSq cs / 2) (x * c)
    have e2 := E.exp_add (m + x * x * sumSq cs / 2) (-(x * c))
    have e3 := E.exp_add (m + x * x * sumSq cs / 2) (x * c * (x * c) / 2)
    rw [show m + x * x * sumSq cs / 2 + x * c = m + x * c + x * x * sumSq cs / 2 by grind]
      at e1
    rw [show m + x * x * sumSq cs / 2 + -(x * c) = m + -(x * c) + x * x * sumSq cs / 2 by grind]
      at e2
    rw [show m + x * x * sumSq cs / 2 + x * c * (x * c) / 2 =
      m + x * x * (c * c + sumSq cs) / 2 by grind] at e3
    have hc := E.cosh_le_exp_half_sq (x * c)
    have hpos := E.exp_pos (m + x * x * sumSq cs / 2)
    have hmul := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hc (Std.le_of_lt hpos)
    grind

/-! ### The uniform grid is sub-Gaussian with the continuous proxy -/

/-- The moment generating function of a `2^K`-point midpoint grid variable of half-width
`h = 2^K e`, shifted by `a`: `Σ_{j<2^K} exp (x (a + (2j + 1 − 2^K) e)) ≤ 2^K exp (x a + x² h²/6)`,
i.e. `E exp (x (a + V)) ≤ exp (x a) exp (x² (h²/3) / 2)`: sub-Gaussian with the variance proxy
`h²/3` of the continuous uniform on `[−h, h]` (`s²/12` for a cell of width `s = 2h`).
Python: `dither.dither_variance_proxy`. -/
theorem grid_mgf_le (E : CoshLaws α) (x a e : α) (K : Nat) :
    rsum (fun j => E.exp (x * (a + (2 * (j : α) + 1 - (2 : α) ^ K) * e))) (2 ^ K) ≤
      (2 : α) ^ K * E.exp (x * a + x * x * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) / 6) := by
  have hg : (2 : α) ^ K * signAvg K (fun s => E.exp (x * (a + dot (dyadic e K) s))) =
      rsum (fun j => E.exp (x * (a + (2 * (j : α) + 1 - (2 : α) ^ K) * e))) (2 ^ K) :=
    signAvg_dyadic (fun v => E.exp (x * v)) e K a
  rw [← hg]
  have h := signAvg_exp_dot_le E x (x * a) (dyadic e K)
  rw [length_dyadic] at h
  rw [signAvg_congr (g := fun s => E.exp (x * dot (dyadic e K) s + x * a))
    (fun s => congrArg E.exp (by grind))]
  have hs := sumSq_dyadic_le e K
  have hxx := mul_self_nonneg' x
  have hs2 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hs hxx
  have hle := E.toExpLaws.exp_le_exp
    (show x * a + x * x * sumSq (dyadic e K) / 2 ≤
      x * a + x * x * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) / 6 by grind)
  have hp := pow_nonneg_of_nonneg (Std.le_of_lt (two_pos (α := α))) K
  exact Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left (Std.le_trans h hle) hp

/-! ### Chernoff tails -/

theorem ind_le_exp (E : ExpLaws α) {v r x : α} (hx : 0 ≤ x) :
    ind (r ≤ v) ≤ E.exp (x * (v - r)) := by
  unfold ind
  split
  · have h0 := Lean.Grind.OrderedRing.mul_nonneg hx (show (0 : α) ≤ v - r by grind)
    have h1 := E.one_add_le_exp (x * (v - r))
    grind
  · have h1 := E.exp_pos (x * (v - r))
    grind

theorem ind_nonneg (P : Prop) : (0 : α) ≤ ind P := by
  unfold ind
  split
  · exact Std.le_of_lt (Lean.Grind.OrderedRing.zero_lt_one (R := α))
  · exact Std.le_refl _

omit [LT α] [Std.LawfulOrderLT α] [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α] in
theorem le_or_le_neg_of_le_absA {r v : α} (h : r ≤ absA v) : r ≤ v ∨ r ≤ -v := by
  unfold absA at h; split at h <;> grind

theorem ind_le_absA_le (r v : α) : (ind (r ≤ absA v) : α) ≤ ind (r ≤ v) + ind (r ≤ -v) := by
  have h0 := ind_nonneg (α := α) (r ≤ v)
  have h1 := ind_nonneg (α := α) (r ≤ -v)
  by_cases h : r ≤ absA v
  · rw [ind_pos h]
    rcases le_or_le_neg_of_le_absA h with h2 | h2
    · rw [ind_pos h2]; grind
    · rw [ind_pos h2]; grind
  · rw [ind_neg h]; grind

/-- Chernoff's bound for a fair-sign sum: if `Σ_k c_k² ≤ σ²` then
`P(Σ_k c_k ε_k ≥ r) ≤ exp (−r²/(2σ²))` for `r ≥ 0`. -/
theorem signAvg_tail_le (E : CoshLaws α) (cs : List α) {r σ2 : α} (hr : 0 ≤ r) (hσ : 0 < σ2)
    (hS : sumSq cs ≤ σ2) :
    signAvg cs.length (fun s => ind (r ≤ dot cs s)) ≤ E.exp (-(r * r / (2 * σ2))) := by
  have hinv : σ2 * σ2⁻¹ = 1 := Lean.Grind.Field.mul_inv_cancel (by grind)
  have hσi := inv_pos_of_pos hσ
  have hx : 0 ≤ r * σ2⁻¹ := Lean.Grind.OrderedRing.mul_nonneg hr (Std.le_of_lt hσi)
  have h1 : signAvg cs.length (fun s => ind (r ≤ dot cs s)) ≤
      signAvg cs.length (fun s => E.exp (r * σ2⁻¹ * dot cs s + -(r * σ2⁻¹ * r))) :=
    signAvg_mono (fun s => by
      rw [show r * σ2⁻¹ * dot cs s + -(r * σ2⁻¹ * r) = r * σ2⁻¹ * (dot cs s - r) by grind]
      exact ind_le_exp E.toExpLaws hx)
  have h2 := signAvg_exp_dot_le E (r * σ2⁻¹) (-(r * σ2⁻¹ * r)) cs
  have hxx := mul_self_nonneg' (r * σ2⁻¹)
  have h3 := Lean.Grind.OrderedRing.mul_le_mul_of_nonneg_left hS hxx
  have hq : r * σ2⁻¹ * (r * σ2⁻¹) * σ2 = r * r * σ2⁻¹ := by
    rw [show r * σ2⁻¹ * (r * σ2⁻¹) * σ2 = r * r * σ2⁻¹ * (σ2 * σ2⁻¹) by grind, hinv]
    grind
  have hd : r * r / (2 * σ2) = r * r * σ2⁻¹ / 2 := by
    have h2i : (2 * σ2)⁻¹ * (2 * σ2) = 1 :=
      Lean.Grind.Field.inv_mul_cancel (by have := two_pos (α := α); grind)
    have : (2 * σ2)⁻¹ = σ2⁻¹ / 2 := by
      have e1 : (2 * σ2)⁻¹ = (2 * σ2)⁻¹ * (2 * σ2) * (σ2⁻¹ / 2) := by
        rw [show (2 * σ2)⁻¹ * (2 * σ2) * (σ2⁻¹ / 2) = (2 * σ2)⁻¹ * (σ2 * σ2⁻¹) by grind, hinv]
        grind
      rw [h2i] at e1
      grind
    rw [Lean.Grind.Field.div_eq_mul_inv, this]
    grind
  have hle := E.toExpLaws.exp_le_exp
    (show -(r * σ2⁻¹ * r) + r * σ2⁻¹ * (r * σ2⁻¹) * sumSq cs / 2 ≤ -(r * r / (2 * σ2)) by
      rw [hd]; grind)
  exact Std.le_trans h1 (Std.le_trans h2 hle)

/-- The two-sided Chernoff bound: `P(|Σ_k c_k ε_k| ≥ r) ≤ 2 exp (−r²/(2σ²))` when
`Σ_k c_k² ≤ σ²`. Python: `dither.subgaussian_radius` (per token, before the union bound). -/
theorem signAvg_abs_tail_le (E : CoshLaws α) (cs : List α) {r σ2 : α} (hr : 0 ≤ r)
    (hσ : 0 < σ2) (hS : sumSq cs ≤ σ2) :
    signAvg cs.length (fun s => ind (r ≤ absA (dot cs s))) ≤
      2 * E.exp (-(r * r / (2 * σ2))) := by
  have hup := signAvg_tail_le E cs hr hσ hS
  have hlo := signAvg_tail_le E (cs.map (fun c => -c)) hr hσ (by rw [sumSq_neg]; exact hS)
  rw [List.length_map] at hlo
  rw [signAvg_congr (g := fun s => ind (r ≤ -dot cs s)) (fun s => by rw [dot_neg])] at hlo
  have hsplit : signAvg cs.length (fun s => ind (r ≤ absA (dot cs s))) ≤
      signAvg cs.length (fun s => ind (r ≤ dot cs s) + ind (r ≤ -dot cs s)) :=
    signAvg_mono (fun s => ind_le_absA_le r (dot cs s))
  rw [signAvg_add] at hsplit
  grind

/-- The tail of a token's logit error `Σ_c w_c V_c`, each `V_c` an independent `2^K`-point
midpoint grid variable of half-width `h = 2^K e` (`signAvg_dyadic`, `signAvg_append`): if
`h² Σ_c w_c² ≤ 3σ²` then `P(|Σ_c w_c V_c| ≥ r) ≤ 2 exp (−r²/(2σ²))`. With `h = ½`
(the unit cell) and `w_c = scale · q_c · s_c` this is the Tier-B radius of
`witcert_calculus.meters.dither`: `σ² = scale² Σ_c q_c² s_c² / 12`. -/
theorem dither_logit_tail (E : CoshLaws α) (e : α) (K : Nat) (ws : List α) {r σ2 : α}
    (hr : 0 ≤ r) (hσ : 0 < σ2)
    (hvar : sumSq ws * (((2 : α) ^ K * e) * ((2 : α) ^ K * e)) ≤ 3 * σ2) :
    signAvg (channelCoeffs e K ws).length
        (fun s => ind (r ≤ absA (dot (channelCoeffs e K ws) s))) ≤
      2 * E.exp (-(r * r / (2 * σ2))) := by
  have h := sumSq_channelCoeffs_le e K ws
  exact signAvg_abs_tail_le E _ hr hσ (by grind)

/-! ### The union bound -/

theorem signAvg_lsum {β : Type} (n : Nat) (g : β → List α → α) (L : List β) :
    signAvg n (fun s => lsum (fun t => g t s) L) = lsum (fun t => signAvg n (g t)) L := by
  induction L with
  | nil => simp only [lsum]; exact signAvg_const n 0
  | cons t L ih =>
    simp only [lsum]
    rw [signAvg_add, ih]

theorem ind_exists_le {β : Type} (P : β → Prop) (L : List β) :
    ind (∃ t ∈ L, P t) ≤ lsum (fun t => (ind (P t) : α)) L := by
  induction L with
  | nil =>
    simp only [lsum]
    rw [ind_neg (by simp)]
    exact Std.le_refl _
  | cons t L ih =>
    simp only [lsum]
    have h0 := ind_nonneg (α := α) (P t)
    have h1 := lsum_nonneg (f := fun t => (ind (P t) : α)) (L := L)
      (fun t _ => ind_nonneg (P t))
    have h2 := ind_nonneg (α := α) (∃ u ∈ L, P u)
    by_cases hE : ∃ u ∈ t :: L, P u
    · rw [ind_pos hE]
      by_cases hP : P t
      · rw [ind_pos hP]; grind
      · have hL : ∃ u ∈ L, P u := by
          obtain ⟨u, hu, hPu⟩ := hE
          rcases List.mem_cons.mp hu with h | h
          · subst h; exact absurd hPu hP
          · exact ⟨u, h, hPu⟩
        rw [ind_pos hL] at ih
        grind
    · rw [ind_neg hE]; grind

/-- The union bound: the probability that some event of the list `L` occurs is at most the sum
of their probabilities. Python: `dither.subgaussian_radius` splits `delta_loc` over the `S`
tokens, `δ/S` each. -/
theorem signAvg_union_le {β : Type} (n : Nat) (P : β → List α → Prop) (L : List β) :
    signAvg n (fun s => ind (∃ t ∈ L, P t s)) ≤
      lsum (fun t => signAvg n (fun s => ind (P t s))) L := by
  rw [← signAvg_lsum]
  exact signAvg_mono (fun s => ind_exists_le (fun t => P t s) L)

end WitCert.Dither

end
