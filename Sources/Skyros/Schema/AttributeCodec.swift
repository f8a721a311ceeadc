import Foundation
import Synchronization

/// Converts attribute values of one Swift type to and from ``StoredValue``.
///
/// Codecs are made once per type, by run-time inspection of the type (native attribute
/// value, optional, RawRepresentable enum, Codable struct), and cached, so reading an
/// attribute is a direct call with no dynamic cast.
public class AnyAttributeCodec: @unchecked Sendable {
    /// The column type.
    public let storageType: StorageType
    /// Whether the Swift type is an optional (the column accepts NULL).
    public let isOptional: Bool
    /// The platform-neutral name of the type, used in the schema description, the
    /// fingerprint and errors: ``AttributeValue/schemaTypeName`` for native types,
    /// `enum:` and the raw type's name for enums, `json` for Codable values; an optional
    /// has the name of its wrapped type (optionality is ``isOptional``).
    public let typeName: String

    init(storageType: StorageType, isOptional: Bool, typeName: String) {
        self.storageType = storageType
        self.isOptional = isOptional
        self.typeName = typeName
    }

    /// Encodes a value of this codec's type given as `Any`.
    func encodeAny(_ value: Any) throws -> StoredValue { fatalError("abstract") }
}

/// The codec of one attribute type.
public final class AttributeCodec<Value>: AnyAttributeCodec, @unchecked Sendable {
    @usableFromInline let decode: (StoredValue) -> Value
    @usableFromInline let encode: (Value) throws -> StoredValue

    init(
        storageType: StorageType, isOptional: Bool, typeName: String,
        decode: @escaping (StoredValue) -> Value,
        encode: @escaping (Value) throws -> StoredValue
    ) {
        self.decode = decode
        self.encode = encode
        super.init(
            storageType: storageType, isOptional: isOptional, typeName: typeName)
    }

    override func encodeAny(_ value: Any) throws -> StoredValue {
        guard let value = value as? Value else {
            throw SkyrosError(.valueNotStorable, "\(value) is not a \(typeName)")
        }
        return try encode(value)
    }
}

/// Builds and caches codecs.
public enum AttributeCodecs {
    /// The codecs made so far, by type.
    private static let cache = Mutex<[ObjectIdentifier: AnyAttributeCodec]>([:])

    /// The codec for `type`, or nil when the type cannot be stored.
    public static func codec<Value>(for type: Value.Type) -> AttributeCodec<Value>? {
        let key = ObjectIdentifier(type)
        if let cached = cache.withLock({ $0[key] }) { return cached as? AttributeCodec<Value> }
        // Made outside the lock: making an optional's codec asks for its wrapped type's.
        guard let made = make(type) else { return nil }
        cache.withLock { $0[key] = made }
        return made
    }

    /// The codec for a type known only at run time.
    static func anyCodec(for type: Any.Type) -> AnyAttributeCodec? {
        func open<T>(_ type: T.Type) -> AnyAttributeCodec? { codec(for: type) }
        return _openExistential(type, do: open)
    }

    private static func make<Value>(_ type: Value.Type) -> AttributeCodec<Value>? {
        if let optional = type as? any _SkyrosOptional.Type {
            return optional._makeOptionalCodec() as? AttributeCodec<Value>
        }
        if let native = type as? any AttributeValue.Type {
            return makeNative(native) as? AttributeCodec<Value>
        }
        if let raw = type as? any RawRepresentable.Type, let codec = makeRaw(raw) {
            return codec as? AttributeCodec<Value>
        }
        if let codable = type as? any Codable.Type {
            return makeCodable(codable) as? AttributeCodec<Value>
        }
        return nil
    }

    /// The common types get a codec specialised for them (a call to `concreteNative` with a
    /// concrete type is compiled for that type), so reading them involves no generic lookup.
    private static func makeNative<A: AttributeValue>(_ type: A.Type) -> AnyAttributeCodec {
        switch type {
        case is String.Type: return concreteNative(String.self)
        case is Int.Type: return concreteNative(Int.self)
        case is Int64.Type: return concreteNative(Int64.self)
        case is Int32.Type: return concreteNative(Int32.self)
        case is Int16.Type: return concreteNative(Int16.self)
        case is Double.Type: return concreteNative(Double.self)
        case is Float.Type: return concreteNative(Float.self)
        case is Bool.Type: return concreteNative(Bool.self)
        case is Date.Type: return concreteNative(Date.self)
        case is Data.Type: return concreteNative(Data.self)
        case is UUID.Type: return concreteNative(UUID.self)
        default: return concreteNative(A.self)
        }
    }

    @inline(__always)
    private static func concreteNative<A: AttributeValue>(_ type: A.Type) -> AnyAttributeCodec {
        AttributeCodec<A>(
            storageType: A.storageType, isOptional: false, typeName: A.schemaTypeName,
            decode: { stored in
                guard let value = A(storedValue: stored) else { corrupt(stored, A.self) }
                return value
            },
            encode: { value in
                let stored = value.storedValue
                if case .real(let double) = stored, double.isNaN {
                    throw SkyrosError(.valueNotStorable, "NaN cannot be stored in a \(A.self) column")
                }
                if case .text(let text) = stored, A.self == Decimal.self, text == "NaN" {
                    throw SkyrosError(.valueNotStorable, "Decimal.nan cannot be stored")
                }
                return stored
            })
    }

    private static func makeRaw<R: RawRepresentable>(_ type: R.Type) -> AnyAttributeCodec? {
        guard let raw = codec(for: R.RawValue.self), !raw.isOptional else { return nil }
        return AttributeCodec<R>(
            storageType: raw.storageType, isOptional: false, typeName: "enum:\(raw.typeName)",
            decode: { stored in
                guard let value = R(rawValue: raw.decode(stored)) else { corrupt(stored, R.self) }
                return value
            },
            encode: { try raw.encode($0.rawValue) })
    }

    private static func makeCodable<C: Codable>(_ type: C.Type) -> AnyAttributeCodec {
        AttributeCodec<C>(
            storageType: .blob, isOptional: false, typeName: "json",
            decode: { stored in
                guard case .blob(let data) = stored, let value = try? JSONDecoder().decode(C.self, from: data)
                else { corrupt(stored, C.self) }
                return value
            },
            encode: { value in
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                do {
                    return .blob(try encoder.encode(value))
                } catch {
                    throw SkyrosError(.valueNotStorable, "\(C.self) value could not be encoded", underlying: error)
                }
            })
    }

    static func makeOptional<Wrapped>(_ type: Wrapped.Type) -> AnyAttributeCodec? {
        guard let inner = codec(for: Wrapped.self), !inner.isOptional else { return nil }
        return AttributeCodec<Wrapped?>(
            storageType: inner.storageType, isOptional: true, typeName: inner.typeName,
            decode: { stored in stored.isNull ? nil : inner.decode(stored) },
            encode: { value in
                guard let value else { return .null }
                return try inner.encode(value)
            })
    }

    private static func corrupt(_ stored: StoredValue, _ type: Any.Type) -> Never {
        preconditionFailure("Skyros: the store holds \(stored), which is not a valid \(type)")
    }
}

/// Implementation detail: lets codecs see through `Optional`.
public protocol _SkyrosOptional {
    static func _makeOptionalCodec() -> AnyAttributeCodec?
}

extension Optional: _SkyrosOptional {
    /// Implementation detail: the codec of `Wrapped?`, found by a cast when a codec is made for
    /// an optional type (nil when `Wrapped` has none).
    public static func _makeOptionalCodec() -> AnyAttributeCodec? {
        AttributeCodecs.makeOptional(Wrapped.self)
    }
}
