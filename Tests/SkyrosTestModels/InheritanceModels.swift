// Entity inheritance: a hierarchy of three levels stored in one table (`Vehicle`), a
// relationship to the parent (Garage.vehicles), one to a subentity (Garage.favorite), and a
// subentity's own to-many (Truck.loads).
import Foundation
import Skyros

@Entity public class Vehicle {
    @Attribute(.unique) public var plate: String = ""
    public var name: String = ""
    @Attribute(.indexed) public var wheels: Int = 4
    public var garage: Garage? = nil
}

@Entity public final class Car: Vehicle {
    public var doors: Int = 4
    public var convertible: Bool = false
}

@Entity public class Truck: Vehicle {
    public var payload: Double = 0
    @Relationship(deleteRule: .cascade) public var loads: [Load] = []
}

@Entity public final class TowTruck: Truck {
    public var hookRating: Int = 0
}

@Entity public final class Garage {
    public var name: String = ""
    @Relationship(inverse: \Vehicle.garage) public var vehicles: [Vehicle] = []
    public var favorite: Car? = nil
}

@Entity public final class Load {
    public var weight: Double = 0
    public var truck: Truck? = nil
}

/// The schema of the inheritance tests.
public let vehicleSchema = Schema([Vehicle.self, Car.self, Truck.self, TowTruck.self, Garage.self, Load.self])

/// The same model before subentities: `Vehicle` alone (the migration test adds Car and Truck).
@Entity(name: "Vehicle") public final class VehicleV1 {
    @Attribute(.unique) public var plate: String = ""
    public var name: String = ""
    @Attribute(.indexed) public var wheels: Int = 4
    public var garage: GarageV1? = nil
}

@Entity(name: "Garage") public final class GarageV1 {
    public var name: String = ""
    public var vehicles: [VehicleV1] = []
}

@Entity(name: "Load") public final class LoadV1 {
    public var weight: Double = 0
}
