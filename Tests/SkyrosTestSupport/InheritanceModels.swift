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

/// Car in a later version: a new non-optional attribute and a new required to-one.
@Entity(name: "Car") public final class CarV2: Vehicle {
    public var doors: Int = 4
    public var convertible: Bool = false
    public var color: String = "red"
    @Relationship(.required) public var registeredAt: Garage? = nil
}

/// Car renamed Coupe (its objects stay, as coupes).
@Entity(originalName: "Car") public final class Coupe: Vehicle {
    public var doors: Int = 4
    public var convertible: Bool = false
}

/// Car as an entity of its own, before it was a subentity of Vehicle.
@Entity(name: "Car") public final class FlatCar {
    public var doors: Int = 4
}

/// A to-many whose destination is a subentity: a keeper's dogs.
@Entity public class Pet {
    public var name: String = ""
}

@Entity public final class Dog: Pet {
    public var keeper: Keeper? = nil
}

@Entity public final class Cat: Pet {
    public var lives: Int = 9
}

@Entity public final class Keeper {
    public var name: String = ""
    public var dogs: [Dog] = []
}

/// The schema of the keeper's dogs.
public let petSchema = Schema([Pet.self, Dog.self, Cat.self, Keeper.self])

/// Car in a later version with a new non-optional attribute only (existing cars get its default).
@Entity(name: "Car") public final class CarV3: Vehicle {
    public var doors: Int = 4
    public var convertible: Bool = false
    public var color: String = "red"
}
