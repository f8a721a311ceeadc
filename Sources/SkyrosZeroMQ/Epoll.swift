import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Linux's `epoll`, reached without a C module: Swift's Glibc module leaves `<sys/epoll.h>`
/// out, so its three functions are looked up in the C library already loaded (`dlsym`) and
/// called as C functions; its constants and `struct epoll_event` are the kernel's ABI, which
/// does not change.
struct Epoll: ~Copyable {
    /// A descriptor can be read (or a listener accepted from).
    static let readable: UInt32 = 0x001
    /// A descriptor can be written.
    static let writable: UInt32 = 0x004
    /// An error is pending on the descriptor.
    static let error: UInt32 = 0x008
    /// The peer hung up.
    static let hangUp: UInt32 = 0x010

    /// `epoll_ctl`'s operations.
    enum Operation: Int32 {
        case add = 1
        case delete = 2
        case modify = 3
    }

    private typealias Create = @convention(c) (Int32) -> Int32
    private typealias Control = @convention(c) (Int32, Int32, Int32, UnsafeMutableRawPointer?) -> Int32
    private typealias Wait = @convention(c) (Int32, UnsafeMutableRawPointer?, Int32, Int32) -> Int32

    /// The C library's functions (they are in every glibc and musl since Linux 2.6.27).
    private struct Functions: @unchecked Sendable {
        let create: Create
        let control: Control
        let wait: Wait

        init?() {
            let library = dlopen(nil, RTLD_NOW)
            guard let create = dlsym(library, "epoll_create1"), let control = dlsym(library, "epoll_ctl"),
                let wait = dlsym(library, "epoll_wait")
            else { return nil }
            self.create = unsafeBitCast(create, to: Create.self)
            self.control = unsafeBitCast(control, to: Control.self)
            self.wait = unsafeBitCast(wait, to: Wait.self)
        }
    }

    private static let functions = Functions()

    /// `struct epoll_event`: 32-bit events, then 64 bits of data (here the descriptor, in its
    /// first 4 bytes); packed on x86-64, aligned to 8 bytes elsewhere.
    #if arch(x86_64)
        private static let stride = 12
        private static let dataOffset = 4
    #else
        private static let stride = 16
        private static let dataOffset = 8
    #endif

    /// The epoll descriptor.
    let descriptor: Int32
    /// Where `wait` writes what is ready.
    private let ready: UnsafeMutableRawPointer
    private let capacity: Int

    /// A new epoll instance (`EPOLL_CLOEXEC`) that reports at most `capacity` descriptors a wait.
    init(capacity: Int) throws(ZMTPError) {
        guard let functions = Self.functions else { throw ZMTPError(code: ENOSYS, operation: "epoll_create1") }
        let descriptor = functions.create(O_CLOEXEC)
        guard descriptor >= 0 else { throw ZMTPError(code: errno, operation: "epoll_create1") }
        self.descriptor = descriptor
        self.capacity = capacity
        ready = UnsafeMutableRawPointer.allocate(byteCount: capacity * Self.stride, alignment: 8)
    }

    deinit {
        close(descriptor)
        ready.deallocate()
    }

    /// Adds, changes or removes what is waited for on `fd`; false when it failed (no memory, or
    /// past `max_user_watches`).
    func control(_ operation: Operation, _ fd: Int32, _ events: UInt32) -> Bool {
        var event: (UInt64, UInt64) = (0, 0)  // room for either layout
        return withUnsafeMutableBytes(of: &event) { bytes in
            bytes.storeBytes(of: events, toByteOffset: 0, as: UInt32.self)
            bytes.storeBytes(of: fd, toByteOffset: Self.dataOffset, as: Int32.self)
            return Self.functions!.control(descriptor, operation.rawValue, fd, bytes.baseAddress)
        } == 0
    }

    /// Waits at most `timeout` milliseconds (-1: forever) for a descriptor to be ready; returns
    /// how many are (0 on a timeout or a signal), each then read with ``event(_:)``.
    func wait(timeout: Int32) -> Int {
        Int(max(0, Self.functions!.wait(descriptor, ready, Int32(capacity), timeout)))
    }

    /// The descriptor and events of the `index`th ready descriptor of the last wait.
    func event(_ index: Int) -> (fd: Int32, events: UInt32) {
        let base = ready + index * Self.stride
        return (
            base.loadUnaligned(fromByteOffset: Self.dataOffset, as: Int32.self), base.loadUnaligned(as: UInt32.self)
        )
    }
}
