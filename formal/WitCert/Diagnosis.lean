/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

/-!
# Diagnosis: attributing an outcome difference to a knob

Mirror of `witcert_calculus.explore.diagnosis`. A design compares arms; each arm sets every
knob. When two arms differ in exactly one knob of the design (a controlled pair), an observed
difference in their outcomes is attributable to that knob. When they differ in two or more
knobs, the comparison is confounded: it cannot attribute the difference to any one of them.

## Main definitions

* `WitCert.Diagnosis.differ`: the knobs of a design on which two arms differ.
* `WitCert.Diagnosis.IgnoresKnob`: an outcome model that does not depend on a knob.

## Main statements

* `WitCert.Diagnosis.mem_differ`: a knob is in `differ K a b` iff it is in `K` and the arms
  differ on it.
* `WitCert.Diagnosis.controlled_pair_attributes`: if two arms differ in exactly the knob `k`,
  every outcome model that ignores `k` gives them the same outcome (the attribution rule).
* `WitCert.Diagnosis.confounded_pair_unidentified`: if two arms differ in two distinct knobs,
  any pair of outcomes is reproduced both by a model that ignores the first knob and by one that
  ignores the second (the refusal rule).
* `WitCert.Diagnosis.differ_two_confounded`: two distinct knobs in `differ K a b` satisfy the
  hypotheses of `confounded_pair_unidentified`.

## Implementation notes

An arm is a function from knobs to values, `κ → ν`; an outcome model is a function of the arm,
`(κ → ν) → β`. The knobs of a design are a list `K`; two arms of the design agree outside it.
Replication and dose-response are checked by the Python side,
`witcert_calculus.explore.diagnosis`, not here. `differ` is built on `List.filter` and is
`noncomputable`: it is evaluated by the kernel, never run (the WebAssembly Lean cannot generate
its code).
-/

@[expose] public section

namespace WitCert.Diagnosis

variable {κ ν β : Type}

/-- The knobs of `K` on which the arms `a` and `b` differ. -/
noncomputable def differ [DecidableEq ν] (K : List κ) (a b : κ → ν) : List κ :=
  K.filter (fun k => !decide (a k = b k))

/-- An outcome model `f` ignores the knob `k`: arms that agree on every other knob have the same
outcome. -/
def IgnoresKnob (k : κ) (f : (κ → ν) → β) : Prop :=
  ∀ x y : κ → ν, (∀ j, j ≠ k → x j = y j) → f x = f y

/-- A knob is in `differ K a b` exactly when it is in `K` and the arms differ on it. -/
theorem mem_differ [DecidableEq ν] {K : List κ} {a b : κ → ν} {j : κ} :
    j ∈ differ K a b ↔ j ∈ K ∧ a j ≠ b j := by
  simp [differ]

/-- The attribution rule: if two arms of a design differ in exactly the knob `k` (a controlled
pair), an outcome model that ignores `k` gives both the same outcome; so an observed difference
is attributable to `k`. -/
theorem controlled_pair_attributes [DecidableEq ν] {K : List κ} {a b : κ → ν} {k : κ}
    (hd : differ K a b = [k]) (hout : ∀ j, j ∉ K → a j = b j) {f : (κ → ν) → β}
    (hf : IgnoresKnob k f) : f a = f b := by
  apply hf a b
  intro j hj
  by_cases hK : j ∈ K
  · apply Classical.byContradiction
    intro hne
    have hmem : j ∈ differ K a b := mem_differ.mpr ⟨hK, hne⟩
    rw [hd, List.mem_singleton] at hmem
    exact hj hmem
  · exact hout j hK

/-- The refusal rule: if two arms differ in two distinct knobs `k₁` and `k₂`, any pair of
outcomes is reproduced both by a model that ignores `k₂` and by one that ignores `k₁`; so the
comparison cannot attribute the difference to either knob (it is confounded). -/
theorem confounded_pair_unidentified [DecidableEq κ] [DecidableEq ν] {a b : κ → ν} {k₁ k₂ : κ}
    (h12 : k₁ ≠ k₂) (h1 : a k₁ ≠ b k₁) (h2 : a k₂ ≠ b k₂) (va vb : β) :
    ∃ f g : (κ → ν) → β, IgnoresKnob k₂ f ∧ IgnoresKnob k₁ g ∧
      f a = va ∧ f b = vb ∧ g a = va ∧ g b = vb := by
  refine ⟨fun x => if x k₁ = a k₁ then va else vb, fun x => if x k₂ = a k₂ then va else vb,
    ?_, ?_, ?_, ?_, ?_, ?_⟩
  · intro x y hxy
    simp only [hxy k₁ h12]
  · intro x y hxy
    simp only [hxy k₂ (Ne.symm h12)]
  · simp
  · simp [Ne.symm h1]
  · simp
  · simp [Ne.symm h2]

-- `h12` is part of the statement (two distinct knobs), not needed by its proof.
set_option linter.unusedVariables false in
/-- Two distinct knobs in `differ K a b` make the comparison confounded: the hypotheses of
`confounded_pair_unidentified` hold for them. -/
theorem differ_two_confounded [DecidableEq κ] [DecidableEq ν] {K : List κ} {a b : κ → ν}
    {k₁ k₂ : κ} (h1 : k₁ ∈ differ K a b) (h2 : k₂ ∈ differ K a b) (h12 : k₁ ≠ k₂) :
    a k₁ ≠ b k₁ ∧ a k₂ ≠ b k₂ :=
  ⟨(mem_differ.mp h1).2, (mem_differ.mp h2).2⟩

end WitCert.Diagnosis

end
