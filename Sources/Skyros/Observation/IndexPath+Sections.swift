import Foundation

extension IndexPath {
    /// An index path of a sectioned list: `[section, item]` (UIKit's `IndexPath(item:section:)`,
    /// which Foundation on Linux lacks).
    public init(item: Int, section: Int) {
        self.init(indexes: [section, item])
    }

    /// The section of a two-element index path.
    public var section: Int {
        get { self[0] }
        set { self[0] = newValue }
    }

    /// The item (row) of a two-element index path.
    public var item: Int {
        get { self[1] }
        set { self[1] = newValue }
    }
}
