/// A first-in first-out queue: an array and the index of its first element, so that taking
/// one is O(1); the taken front is dropped once it is most of the array (amortised O(1)).
struct FIFO<Element> {
    private var elements: [Element?] = []
    private var start = 0

    var count: Int { elements.count - start }
    var first: Element? { start < elements.count ? elements[start] : nil }

    mutating func append(_ element: Element) { elements.append(element) }

    mutating func removeFirst() -> Element? {
        guard start < elements.count else { return nil }
        defer {
            elements[start] = nil  // released now, not at the next compaction
            start += 1
            if start == elements.count {
                elements.removeAll(keepingCapacity: elements.count <= 4_096)
                start = 0
            } else if start > 1_024 && start * 2 > elements.count {
                elements.removeFirst(start)
                start = 0
            }
        }
        return elements[start]
    }

    /// Changes every element still in the queue.
    mutating func modifyEach(_ change: (inout Element) -> Void) {
        for index in start..<elements.count where elements[index] != nil { change(&elements[index]!) }
    }
}
