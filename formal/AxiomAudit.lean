/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
import Lean

/-!
# Axiom audit (runs on an official toolchain only)

`lake exe axiom_audit` prints a JSON array with one object per theorem of the `WitCert`
namespace: its name, its elaborated statement, and the axioms it depends on, computed by
`Lean.collectAxioms`. `tests/test_formal.py` reads the array from `formal/build/axioms.json`
when present and fails on `sorryAx` or on any axiom outside `propext`, `Classical.choice`,
`Quot.sound`.

The theorems are loaded when the program runs (`importModules`), so build the library first
(`lake build`). `python scripts/lean_driver.py --root . --from-audit formal/build/axioms.json`
then writes `formal/build/theorems.json` from this output, in the format of the wasm build's
export (`"axiom_audit": "collectAxioms"`, each theorem's axioms), so the Python cross-checks
and the statement lock read the output of either path.

The WebAssembly Lean used in CI compiles this file (the program avoids `Array.qsort` and
`Array.map`, whose private implementations that build does not ship) but cannot run it: its
interpreter loads only the exported level of `.olean` files, and `#print axioms` is refused
inside a `module`. There the audit is the build's source scan instead (`scripts/lean_audit.py`:
no `sorry` warning, no `axiom` declaration, no `native_decide` / `ofReduceBool` /
`implemented_by` / `extern` / `unsafe` / `opaque` / `debug.*` option, no meta code that adds
declarations), with the compiled `.olean` files checked for axioms and for exactly the exported
theorems; `formal/build/theorems.json` records which audit ran. This program is the one module
the audit lets `import Lean`.
-/

open Lean

/-- The theorems of the `WitCert` namespace in `env` (in the environment's order; the test
that reads the output does not depend on it). -/
def witcertTheorems (env : Environment) : List (Name × ConstantInfo) :=
  env.constants.fold (init := []) fun acc n c =>
    match c with
    | .thmInfo _ => if (`WitCert).isPrefixOf n && !n.isInternal then (n, c) :: acc else acc
    | _ => acc

/-- Print the audit as JSON on standard output. -/
def main : IO Unit := do
  initSearchPath (← findSysroot)
  let env ← importModules #[{ module := `WitCert }] {}
  let ctx : Core.Context := { fileName := "<axiom_audit>", fileMap := default }
  let st : Core.State := { env }
  let mut rows : Array Json := #[]
  for (n, c) in witcertTheorems env do
    let (axs, _) ← (collectAxioms n : CoreM (Array Name)).toIO ctx st
    let (fmt, _) ← ((PrettyPrinter.ppExpr c.type).run' {} {} : CoreM Format).toIO ctx st
    rows := rows.push <| Json.mkObj [
      ("name", toJson n.toString),
      ("statement", toJson (fmt.pretty 1000000)),
      ("axioms", toJson (axs.toList.map Name.toString)),
      ("axiom_audit", toJson "collectAxioms")]
  IO.println (Json.arr rows).pretty
