/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Bridges

/-!
# Format witnesses: the residual bound an fp8 code carries by itself

Mirror of `witcert_calculus.meters.formats` (and of
`witcert_calculus.meters.witness.tighter`). A cache that stores keys as fp8 codes with a scale `s` holds `s q` for the code's value `q`. When the
writer's rounding rule is known, the code alone bounds the residual of every channel: the true key
`x` lies within `w = s (g + η (|q| + g) + ε)` of `s q`, where `g` is the grid step of the rounding
at the code, `η` the relative and `ε` the absolute slack of the writer's float32 arithmetic. The
logit error then obeys the box bound `|s ⟨q, r⟩| ≤ s Σ_c |q_c| w_c`, channel by channel.

The writer modelled: `v = fl32(x / s)` (or `fl32(x · fl32(1/s))`), then rounded onto the format's
grid, toward zero or to nearest, giving the code value `q`.

## Main definitions

* `WitCert.Formats.Fp8Format`, `WitCert.Formats.e4m3`, `WitCert.Formats.e5m2`: an fp8 format by
  its mantissa bits, exponent bias and the magnitude code where the writer clamps.
* `WitCert.Formats.codeStep`: the grid step of a code (its unit in the last place; the subnormal
  step for zero and the subnormals), `2^(max(e, 1) − bias − m)`.
* `WitCert.Formats.codeValue`: the exact value of a code.
* `WitCert.Formats.gridStep`: the rounding's bound `g` on `|v − q|` (`codeStep`, or half of it for
  the round-to-nearest writer).
* `WitCert.Formats.witness`: Python's `witness_exact`, `none` for a code that may hold a clamped
  value (saturated).

## Main statements

* `WitCert.Formats.box_logit_bound_sound`: `|s Σ_c q_c r_c| ≤ s Σ_c |q_c| w_c` for `s ≥ 0` when
  every `|r_c| ≤ w_c` (Python: `formats.format_logit_bound`).
* `WitCert.Formats.min_bound_sound`: two bounds of one error bound it by their minimum (Python:
  `witness.tighter`).
* `WitCert.Formats.trunc_residual_le`: truncation toward zero onto a grid of step `g`, after a
  rescaling that may round up by `ρ ≤ g`, leaves `|v − q| ≤ g`.
* `WitCert.Formats.nearest_residual_le`: a code at least as close to `v` as both grid neighbours
  `lo ≤ v ≤ hi`, with `hi − lo ≤ 2 g`, leaves `|v − q| ≤ g`.
* `WitCert.Formats.format_residual_le`: `|v − q| ≤ g` and the float32 arithmetic
  `|x − s v| ≤ s (η |v| + ε)` give `|x − s q| ≤ s (g + η (|q| + g) + ε)`.

## Implementation notes

Floating point is not modelled: the float32 roundings of the writer enter as the hypotheses of
`trunc_residual_le` (`ρ`) and `format_residual_le` (`η`, `ε`), whose sizes are a numerical
argument made in Python (`ETA = 2^-22`, `EPS = 2^-149`). The definitions mirror Python's code
for codes `0 … 255`; `WitCert.GeneratedChecks` compares them, for every code of both formats,
both roundings and two scales, with the values Python's own code computes, by `decide +kernel`.
Each definition is tied to the statements by an `example` at the end of this file.
-/

@[expose] public section

namespace WitCert

namespace Formats

open WitCert.Bridges

/-! ### The statements -/

/-- `|v − q| ≤ g` gives `|v| ≤ |q| + g`. -/
theorem abs_le_abs_add_of_abs_sub_le {v q g : Rat} (h : abs (v - q) ≤ g) :
    abs v ≤ abs q + g := by
  have hd := abs_le_iff.mp h
  unfold abs
  split <;> split <;> grind

/-- One channel: `|r| ≤ w` gives `|q r| ≤ |q| w`. -/
theorem abs_mul_le_of_abs_le {q r w : Rat} (h : abs r ≤ w) : abs (q * r) ≤ abs q * w := by
  have hr := abs_le_iff.mp h
  rw [abs_le_iff]
  unfold abs
  split
  · have h1 := Rat.mul_le_mul_of_nonneg_left hr.1 (by assumption)
    have h2 := Rat.mul_le_mul_of_nonneg_left hr.2 (by assumption)
    constructor <;> grind
  · have hq : 0 ≤ -q := by grind
    have h1 := Rat.mul_le_mul_of_nonneg_left hr.1 hq
    have h2 := Rat.mul_le_mul_of_nonneg_left hr.2 hq
    constructor <;> grind

/-- The channels together: `|Σ_c q_c r_c| ≤ Σ_c |q_c| w_c` when every `|r_c| ≤ w_c` (the
triangle inequality over the channels). -/
theorem abs_sum_mul_le (l : List (Rat × Rat × Rat)) (hw : ∀ e ∈ l, abs e.2.1 ≤ e.2.2) :
    abs (l.map fun e => e.1 * e.2.1).sum ≤ (l.map fun e => abs e.1 * e.2.2).sum := by
  rw [abs_le_iff]
  induction l with
  | nil => simp only [List.map_nil, List.sum_nil]; grind
  | cons e l ih =>
    have ih' := ih (fun f hf => hw f (by simp [hf]))
    have he := abs_le_iff.mp (abs_mul_le_of_abs_le (q := e.1) (hw e (by simp)))
    simp only [List.map_cons, List.sum_cons]
    constructor <;> grind

/-- The box bound (Tier A): each entry `(q_c, r_c, w_c)` of one token holds a query channel
`q_c`, the key residual's channel `r_c` and its per-channel witness `w_c ≥ |r_c|`. For an attention
scale `s ≥ 0` the logit error obeys `|s Σ_c q_c r_c| ≤ c = s Σ_c |q_c| w_c`, the exact maximum of
the logit error over the box of residuals. Python: `formats.format_logit_bound`. -/
theorem box_logit_bound_sound (l : List (Rat × Rat × Rat)) {s : Rat} (hs : 0 ≤ s)
    (hw : ∀ e ∈ l, abs e.2.1 ≤ e.2.2) :
    abs (s * (l.map fun e => e.1 * e.2.1).sum) ≤ s * (l.map fun e => abs e.1 * e.2.2).sum := by
  have h := abs_le_iff.mp (abs_sum_mul_le l hw)
  have h1 := Rat.mul_le_mul_of_nonneg_left h.1 hs
  have h2 := Rat.mul_le_mul_of_nonneg_left h.2 hs
  rw [abs_le_iff]
  constructor <;> grind

/-- Two bounds of one error: `|e| ≤ a` and `|e| ≤ b` give `|e| ≤ min a b`. Python:
`witness.tighter`, the token-wise smaller of two established bounds. -/
theorem min_bound_sound {e a b : Rat} (ha : abs e ≤ a) (hb : abs e ≤ b) : abs e ≤ min a b := by
  grind

/-- The truncating writer: the code value `q` has the sign of the rescaled value `v`
(`0 ≤ q v`), truncation toward zero onto a grid of step `g` leaves `|v| ≤ |q| + g`, and the
float32 rescaling of a subnormal may round up by `ρ` (`|q| ≤ |v| + ρ`, `0 ≤ ρ ≤ g`). Then
`|v − q| ≤ g`. Python: `formats.witness_exact` with `Rounding.TRUNCATE`. -/
theorem trunc_residual_le {v q g ρ : Rat} (hs : 0 ≤ q * v) (hq : abs q ≤ abs v + ρ)
    (hv : abs v ≤ abs q + g) (hρ : 0 ≤ ρ) (hρg : ρ ≤ g) : abs (v - q) ≤ g := by
  have h1 : ¬ (0 < q ∧ v < 0) := fun ⟨h1, h2⟩ => by
    have := Rat.mul_pos h1 (show 0 < -v by grind)
    grind
  have h2 : ¬ (q < 0 ∧ 0 < v) := fun ⟨h1, h2⟩ => by
    have := Rat.mul_pos (show 0 < -q by grind) h2
    grind
  unfold abs at *
  grind

/-- The round-to-nearest writer: `v` lies between two grid points `lo ≤ v ≤ hi` at most `2 g`
apart, and the code value `q` is at least as close to `v` as both. Then `|v − q| ≤ g` (with
`g` half the grid step, `gridStep _ true`). Python: `Rounding.NEAREST`. -/
theorem nearest_residual_le {v q lo hi g : Rat} (hlo : lo ≤ v) (hhi : v ≤ hi)
    (hstep : hi - lo ≤ 2 * g) (hnlo : abs (v - q) ≤ abs (v - lo))
    (hnhi : abs (v - q) ≤ abs (v - hi)) : abs (v - q) ≤ g := by
  unfold abs at *
  grind

/-- The float32 arithmetic of the writer: if the rounding onto the grid leaves `|v − q| ≤ g`
and the rescaling leaves `|x − s v| ≤ s (η |v| + ε)` (relative slack `η ≥ 0`, absolute slack `ε`,
scale `s ≥ 0`), then the stored `s q` is within `s (g + η (|q| + g) + ε)` of the true `x`.
Python: `formats.witness_exact`, `w = s (g + ETA (|q| + g) + EPS)`. -/
theorem format_residual_le {x v q s g η ε : Rat} (hs : 0 ≤ s) (hη : 0 ≤ η)
    (hvq : abs (v - q) ≤ g) (hx : abs (x - s * v) ≤ s * (η * abs v + ε)) :
    abs (x - s * q) ≤ s * (g + η * (abs q + g) + ε) := by
  have hd := abs_le_iff.mp hvq
  have h1 := Rat.mul_le_mul_of_nonneg_left (abs_le_abs_add_of_abs_sub_le hvq) hη
  have h2 : s * (η * abs v + ε) ≤ s * (η * (abs q + g) + ε) :=
    Rat.mul_le_mul_of_nonneg_left (by grind) hs
  have h3 := Rat.mul_le_mul_of_nonneg_left hd.1 hs
  have h4 := Rat.mul_le_mul_of_nonneg_left hd.2 hs
  have hx' := abs_le_iff.mp hx
  rw [abs_le_iff]
  constructor <;> grind

/-! ### fp8 codes, as Python computes them -/

/-- An 8-bit floating-point storage format (sign, exponent, mantissa; no infinities used). -/
structure Fp8Format where
  /-- Stored mantissa bits `m`. -/
  mantissaBits : Nat
  /-- Exponent bias. -/
  bias : Nat
  /-- The magnitude code of the largest finite value, where the writer clamps. -/
  maxCode : Nat

/-- e4m3: 3 mantissa bits, bias 7, largest finite value 448 at `0x7E`. -/
def e4m3 : Fp8Format := ⟨3, 7, 0x7E⟩

/-- e5m2: 2 mantissa bits, bias 15, largest finite value 57344 at `0x7B`. -/
def e5m2 : Fp8Format := ⟨2, 15, 0x7B⟩

/-- The magnitude part of a code `0 … 255` (the sign bit cleared), `code & 0x7F`. -/
def codeMag (code : Nat) : Nat := code % 128

/-- The stored exponent field `e = mag / 2^m`. -/
def codeExp (fmt : Fp8Format) (code : Nat) : Nat := codeMag code / 2 ^ fmt.mantissaBits

/-- The stored mantissa field `f = mag % 2^m`. -/
def codeFrac (fmt : Fp8Format) (code : Nat) : Nat := codeMag code % 2 ^ fmt.mantissaBits

/-- The grid step at a code, its unit in the last place: `2^(max(e, 1) − bias − m)` (the
subnormal step for zero and the subnormals). Python: `formats.code_step`. -/
def codeStep (fmt : Fp8Format) (code : Nat) : Rat :=
  ((2 ^ max (codeExp fmt code) 1 : Nat) : Rat) /
    ((2 ^ (fmt.bias + fmt.mantissaBits) : Nat) : Rat)

/-- The magnitude of a code's value: `f · step` for a subnormal (`e = 0`), `(2^m + f) · step`
otherwise. -/
def codeMagValue (fmt : Fp8Format) (code : Nat) : Rat :=
  if codeExp fmt code = 0 then (codeFrac fmt code : Rat) * codeStep fmt code
  else ((2 ^ fmt.mantissaBits + codeFrac fmt code : Nat) : Rat) * codeStep fmt code

/-- The exact value of a code `0 … 255`, negated when the sign bit is set (codes above the largest
finite one included). Python: `formats.code_value`. -/
def codeValue (fmt : Fp8Format) (code : Nat) : Rat :=
  if 128 ≤ code then -codeMagValue fmt code else codeMagValue fmt code

/-- The rounding's bound `g` on `|v − q|` at a code: the grid step for the truncating writer,
half of it for the round-to-nearest writer (`half = true`). -/
def gridStep (fmt : Fp8Format) (half : Bool) (code : Nat) : Rat :=
  if half then codeStep fmt code / 2 else codeStep fmt code

/-- The format witness of one code: `none` (saturated) when the magnitude code is at least the
clamping code (it may hold a clamped value of any size), else `w = s (g + η (|q| + g) + ε)` with
`g = gridStep fmt half code` and `q = codeValue fmt code`. Python: `formats.witness_exact`
(`half`: `Rounding.NEAREST`; `η = ETA`, `ε = EPS`). -/
def witness (fmt : Fp8Format) (half : Bool) (s η ε : Rat) (code : Nat) : Option Rat :=
  if fmt.maxCode ≤ codeMag code then none
  else some (s * (gridStep fmt half code +
    η * (abs (codeValue fmt code) + gridStep fmt half code) + ε))

/-! ### The definitions are the statements' quantities

Each `example` restates a theorem with the definitions above, proved from the theorem itself, so
a definition that drifted from the statements fails here; `WitCert.GeneratedChecks` compares the
definitions with Python's values. -/

/-- `trunc_residual_le` at a code: the truncating writer's `|v − q|` is at most
`gridStep fmt false code`, the code's grid step. -/
example {fmt : Fp8Format} {code : Nat} {v ρ : Rat} (hs : 0 ≤ codeValue fmt code * v)
    (hq : abs (codeValue fmt code) ≤ abs v + ρ)
    (hv : abs v ≤ abs (codeValue fmt code) + codeStep fmt code) (hρ : 0 ≤ ρ)
    (hρg : ρ ≤ codeStep fmt code) :
    abs (v - codeValue fmt code) ≤ gridStep fmt false code :=
  trunc_residual_le hs hq hv hρ hρg

/-- `nearest_residual_le` at a code: between grid neighbours at most one grid step apart, the
round-to-nearest writer's `|v − q|` is at most `gridStep fmt true code`, half the step. -/
example {fmt : Fp8Format} {code : Nat} {v lo hi : Rat} (hlo : lo ≤ v) (hhi : v ≤ hi)
    (hstep : hi - lo ≤ codeStep fmt code)
    (hnlo : abs (v - codeValue fmt code) ≤ abs (v - lo))
    (hnhi : abs (v - codeValue fmt code) ≤ abs (v - hi)) :
    abs (v - codeValue fmt code) ≤ gridStep fmt true code :=
  nearest_residual_le hlo hhi (by show hi - lo ≤ 2 * (codeStep fmt code / 2); grind) hnlo hnhi

/-- `format_residual_le` at a code: when the rounding leaves `|v − q| ≤ gridStep` and `witness`
returns `some w`, the stored `s q` is within `w` of the true `x`. -/
example {fmt : Fp8Format} {half : Bool} {code : Nat} {x v s η ε w : Rat} (hs : 0 ≤ s)
    (hη : 0 ≤ η) (hvq : abs (v - codeValue fmt code) ≤ gridStep fmt half code)
    (hx : abs (x - s * v) ≤ s * (η * abs v + ε)) (hw : witness fmt half s η ε code = some w) :
    abs (x - s * codeValue fmt code) ≤ w := by
  unfold witness at hw
  split at hw
  · cases hw
  · cases hw
    exact format_residual_le hs hη hvq hx

end Formats

end WitCert

end
