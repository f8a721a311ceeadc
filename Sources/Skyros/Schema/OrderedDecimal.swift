import Foundation

/// The stored form of a `Decimal`: ASCII text whose byte order (SQLite's BINARY collation)
/// is the numeric order, so that SQL sorts and compares decimal columns as numbers, and
/// equal numbers have the same text whatever their written form (1.5 and 1.50).
///
/// A nonzero value is written `0.d₁d₂…dₙ × 10^E`, its digits without leading or trailing
/// zeros (d₁ ≠ 0, dₙ ≠ 0). Then:
/// - zero is `o`;
/// - a positive value is `p`, then E + 500 in three digits, then d₁…dₙ
///   (9.5 is `p50195`, 10.25 is `p5021025`, 0.001 is `p4981`);
/// - a negative value is `n`, then 499 − E in three digits, then each digit's complement
///   9 − dᵢ, then `~` (-9.5 is `n49804~`, -100.5 is `n4968994~`).
///
/// `n` < `o` < `p` puts negatives before zero before positives. Among positives a larger
/// exponent sorts later, then the digits compare as a fraction (with no trailing zeros, a
/// prefix is the smaller number). Among negatives everything is reversed: the exponent is
/// subtracted from 499 and the digits complemented; the `~` (after every digit) ends the
/// digits so that a shorter one sorts after the longer ones it starts (-0.1 after -0.15).
/// E is between −127 and 166 for a `Decimal`; the form allows −499…499.
///
/// The text never starts like the POSIX notation Skyros stored before (`-12.5`, `0.001`),
/// so the two are told apart by the first character.
public enum OrderedDecimal {
    /// The stored form of `value`; nil for NaN.
    public static func encode(_ value: Decimal) -> String? {
        if value.isNaN { return nil }
        var copy = value
        return encode(plain: NSDecimalString(&copy, Locale(identifier: "en_US_POSIX")))
    }

    /// The stored form of a decimal written in plain notation (an optional sign, digits with
    /// an optional `.`, an optional exponent: `-12.50`, `.5`, `1e3`); nil when `text` is not
    /// one, or its exponent is out of the form's range, or it has more than 39 significant
    /// digits.
    public static func encode(plain text: String) -> String? {
        var bytes = Array(text.utf8)[...]
        var negative = false
        if let first = bytes.first, first == UInt8(ascii: "-") || first == UInt8(ascii: "+") {
            negative = first == UInt8(ascii: "-")
            bytes = bytes.dropFirst()
        }
        var digits: [UInt8] = []
        var integerDigits = 0
        var seenPoint = false
        while let byte = bytes.first {
            if byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") {
                digits.append(byte)
                if !seenPoint { integerDigits += 1 }
            } else if byte == UInt8(ascii: "."), !seenPoint {
                seenPoint = true
            } else {
                break
            }
            bytes = bytes.dropFirst()
        }
        guard !digits.isEmpty else { return nil }
        var exponent = 0
        if let byte = bytes.first, byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E") {
            guard let value = Int(String(decoding: bytes.dropFirst(), as: UTF8.self)), (-9_999...9_999).contains(value)
            else {
                return nil
            }
            exponent = value
        } else if !bytes.isEmpty {
            return nil
        }
        // 0.d₁…dₙ × 10^E: each leading zero dropped moves the point one place right.
        guard let first = digits.firstIndex(where: { $0 != UInt8(ascii: "0") }) else { return "o" }
        let last = digits.lastIndex(where: { $0 != UInt8(ascii: "0") })!
        let power = integerDigits + exponent - first
        guard power >= -499 && power <= 499, last - first < 39 else { return nil }
        let significant = digits[first...last]
        if negative {
            return "n" + threeDigits(499 - power)
                + String(decoding: significant.map { UInt8(ascii: "9") - ($0 - UInt8(ascii: "0")) }, as: UTF8.self)
                + "~"
        }
        return "p" + threeDigits(power + 500) + String(decoding: significant, as: UTF8.self)
    }

    /// The decimal a stored form stands for; nil when `text` is not in the form, or has more
    /// digits than a `Decimal` holds.
    public static func decode(_ text: String) -> Decimal? {
        guard isWellFormed(text) else { return nil }
        let bytes = Array(text.utf8)
        if bytes[0] == UInt8(ascii: "o") { return Decimal.zero }
        let negative = bytes[0] == UInt8(ascii: "n")
        let biased = Int(String(decoding: bytes[1..<4], as: UTF8.self))!
        let significant = negative ? bytes[4..<(bytes.count - 1)] : bytes[4...]
        let digits = negative ? significant.map { UInt8(ascii: "9") - ($0 - UInt8(ascii: "0")) } : Array(significant)
        let power = negative ? 499 - biased : biased - 500
        // The digits as an integer, built exactly from chunks of up to 18 digits.
        var mantissa = Decimal.zero
        var index = 0
        while index < digits.count {
            let end = min(index + 18, digits.count)
            let chunk = UInt64(String(decoding: digits[index..<end], as: UTF8.self))!
            var scale = Decimal(1)
            for _ in index..<end { scale *= 10 }
            mantissa = mantissa * scale + Decimal(chunk)
            index = end
        }
        let exponent = power - digits.count
        guard exponent >= -128 else { return nil }
        guard exponent <= 127 else {
            // A Decimal's exponent is at most 127: the rest goes into the mantissa as zeros,
            // which the plain notation lets the parser do.
            let plain =
                (negative ? "-" : "") + String(decoding: digits, as: UTF8.self)
                + String(repeating: "0", count: exponent - 127) + "e127"
            return Decimal(string: plain, locale: Locale(identifier: "en_US_POSIX")).flatMap { $0.isNaN ? nil : $0 }
        }
        let value = Decimal(sign: negative ? .minus : .plus, exponent: exponent, significand: mantissa)
        return value.isNaN ? nil : value
    }

    /// Whether `text` has the stored form's shape, with at most 39 digits (a `Decimal`'s
    /// mantissa holds up to 2¹²⁸ − 1), without building the decimal.
    public static func isWellFormed(_ text: String) -> Bool {
        isWellFormed(Array(text.utf8))
    }

    private static func isWellFormed(_ bytes: [UInt8]) -> Bool {
        guard let marker = bytes.first else { return false }
        if marker == UInt8(ascii: "o") { return bytes.count == 1 }
        let negative = marker == UInt8(ascii: "n")
        guard negative || marker == UInt8(ascii: "p"), bytes.count >= (negative ? 6 : 5),
            bytes.count <= (negative ? 44 : 43),
            bytes[1..<4].allSatisfy(isDigit)
        else { return false }
        let significant = negative ? bytes[4..<(bytes.count - 1)] : bytes[4...]
        if negative && bytes.last != UInt8(ascii: "~") { return false }
        // No leading or trailing zero: 9 for a negative value's complemented digits.
        let zero = negative ? UInt8(ascii: "9") : UInt8(ascii: "0")
        return significant.allSatisfy(isDigit) && significant.first != zero && significant.last != zero
    }

    /// Whether `text` starts like the stored form (and not like the plain notation).
    public static func looksEncoded(_ text: String) -> Bool {
        guard let first = text.utf8.first else { return false }
        return first == UInt8(ascii: "n") || first == UInt8(ascii: "o") || first == UInt8(ascii: "p")
    }

    private static func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }

    private static func threeDigits(_ value: Int) -> String {
        let text = String(value)
        return String(repeating: "0", count: max(0, 3 - text.count)) + text
    }
}
