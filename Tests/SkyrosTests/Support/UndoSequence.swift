import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// A seeded random sequence of edits, undos, redos and saves on a stack's main context, checked
/// against a model of the undo stacks: each undo must give back the graph from before its step,
/// each redo the graph after it, and each save must store what the main context shows.
struct UndoSequence {
    /// How often each of the three happens, out of `edits + undos + redos`: a choice below
    /// `edits` is an edit (`edit` gets it), and an undo or redo that cannot happen is an edit.
    var edits: Int
    var undos: Int
    var redos: Int
    var steps: Int
    /// The environment variable that picks another seed, and the default seed.
    var seedVariable: String
    var seed: UInt64
    /// Whether an edit that leaves the graph as it was is no step (a link that was there
    /// already: nothing is recorded), rather than a step that changes nothing (a value set to
    /// the value it had is recorded, as Foundation's undo manager records it).
    var unchangedIsNoStep = false

    struct Counts {
        var edits = 0, undos = 0, redos = 0, saves = 0
    }

    /// `edit(choice, serial, generator)` makes one edit in the main context (inside one of its
    /// blocks) and returns whether it tried to change something; `graph` describes a context.
    func run(
        _ stack: TestStack, _ undo: UndoManager, graph: (ObjectContext) throws -> String,
        edit: (Int, Int, inout SeededGenerator) throws -> Bool
    ) throws -> Counts {
        let main = stack.store.mainContext
        var generator = SeededGenerator(seed: UInt64(ProcessInfo.processInfo.environment[seedVariable] ?? "") ?? seed)
        var undoable: [(before: String, after: String)] = []
        var redoable: [(before: String, after: String)] = []
        var counts = Counts()
        for step in 0..<steps {
            let before = try graph(main)
            let choice = Int.random(in: 0..<(edits + undos + redos), using: &generator)
            if (edits..<(edits + undos)).contains(choice) && undo.canUndo {
                undo.undo()
                counts.undos += 1
                let done = undoable.removeLast()
                #expect(try graph(main) == done.before, "step \(step): undo")
                redoable.append(done)
            } else if choice >= edits + undos && undo.canRedo {
                undo.redo()
                counts.redos += 1
                let done = redoable.removeLast()
                #expect(try graph(main) == done.after, "step \(step): redo")
                undoable.append(done)
            } else {
                counts.edits += 1
                let tried = try main.performAndWait { try edit(choice % edits, counts.edits, &generator) }
                let after = try graph(main)
                if tried && (after != before || !unchangedIsNoStep) {
                    undoable.append((before, after))
                    redoable = []
                }
            }
            #expect(undo.canUndo == !undoable.isEmpty && undo.canRedo == !redoable.isEmpty, "step \(step)")
            if Bool.random(using: &generator) {
                try stack.store.saveMainContext()
                counts.saves += 1
                #expect(
                    try graph(ObjectContext(name: "fresh", parent: stack.store.store)) == graph(main),
                    "step \(step): stored")
            }
        }
        return counts
    }
}
