import Foundation
import Skyros
import SkyrosTestModels
import Testing

/// Entity inheritance (`vehicleSchema` in SkyrosTestModels): one table per hierarchy, on every stack.
@Suite("Entity inheritance", .timeLimit(.minutes(3)))
struct InheritanceTests {
    func stack(_ kind: StoreKind) throws -> TestStack { try TestStack(kind, schema: vehicleSchema) }

    /// Each object's class and plate, sorted.
    static func describe(_ objects: [Vehicle]) -> [String] {
        objects.map { "\(type(of: $0)):\($0.plate)" }.sorted()
    }

    /// A garage with a car, a truck carrying two loads and a tow truck; the car is its favourite.
    static func seed(in context: ObjectContext) {
        let garage = Garage.create(in: context)
        garage.name = "central"
        let plain = Vehicle.create(in: context)
        plain.plate = "V1"
        plain.name = "cart"
        plain.wheels = 2
        let car = Car.create(in: context)
        car.plate = "C1"
        car.name = "roadster"
        car.doors = 2
        car.convertible = true
        car.garage = garage
        let truck = Truck.create(in: context)
        truck.plate = "T1"
        truck.name = "hauler"
        truck.wheels = 6
        truck.payload = 12.5
        truck.garage = garage
        for weight in [1.0, 2.0] {
            let load = Load.create(in: context)
            load.weight = weight
            load.truck = truck
        }
        let tow = TowTruck.create(in: context)
        tow.plate = "W1"
        tow.name = "hook"
        tow.wheels = 6
        tow.hookRating = 9
        garage.favorite = car
    }

    @Test("one table per hierarchy: the root's entity holds every class's properties and _entity; the description lists the subentities")
    func schemaShape() throws {
        try vehicleSchema.validate()
        #expect(vehicleSchema.entities.map(\.name) == ["Vehicle", "Garage", "Load"])
        let vehicle = try #require(vehicleSchema.entity(named: "Vehicle"))
        #expect(vehicle.properties.map(\.name) == [
            "plate", "name", "wheels", "garage", "doors", "convertible", "payload", "loads", "hookRating", "_entity",
        ])
        #expect(vehicleSchema.entity(named: "Car") === vehicle)
        #expect(vehicleSchema.entity(for: TowTruck.self) === vehicle)
        #expect(vehicle.property(for: \Car.name)?.name == "name")
        #expect(vehicle.property(for: \TowTruck.payload)?.name == "payload")
        #expect(vehicle.propertyBase(of: Car.self) == 4)
        #expect(vehicle.propertyBase(of: TowTruck.self) == 8)
        // A relationship to a subentity points at the hierarchy's table.
        #expect(vehicleSchema.entity(named: "Garage")?.property(named: "favorite")?.destinationName == "Vehicle")
        let description = vehicleSchema.schemaDescription
        let subentities = try #require(description.entities[0].subentities)
        #expect(subentities == [
            SchemaDescription.Subentity(name: "Car", parent: "Vehicle", properties: ["doors", "convertible"]),
            SchemaDescription.Subentity(name: "Truck", parent: "Vehicle", properties: ["payload", "loads"]),
            SchemaDescription.Subentity(name: "TowTruck", parent: "Truck", properties: ["hookRating"]),
        ])
        // A subentity's own columns may hold NULL (the other entities' rows), whatever their type.
        #expect(description.entities[0].properties.first { $0.name == "doors" }?.isOptional == true)
        #expect(description.entities[0].properties.first { $0.name == "wheels" }?.isOptional == false)
        let json = String(decoding: try description.canonicalJSON(), as: UTF8.self)
        #expect(json.contains(#""subentities":[{"name":"Car","parent":"Vehicle","properties":["doors","convertible"]},"#))
        #expect(try Schema(description: description).fingerprint == vehicleSchema.fingerprint)
        let decoded = try JSONDecoder().decode(SchemaDescription.self, from: try description.canonicalJSON())
        #expect(try Schema(description: decoded).fingerprint == vehicleSchema.fingerprint)
        #expect(try SchemaDescription(json: Array(try description.canonicalJSON())) == description)
        #expect(vehicleSchema.fingerprintText.contains("subentity TowTruck < Truck: hookRating"))
    }

    @Test("a subentity without its parent, and two entities of a hierarchy declaring one property, are refused")
    func refusedHierarchies() throws {
        let orphan = try #require(throws: SkyrosError.self) { try Schema([Car.self, Garage.self]).validate() }
        #expect(orphan.code == .invalidSchema)
        #expect(orphan.message.contains("Car: its parent entity Vehicle is not in the schema"))
    }

    @Test("fetching a parent returns its subentities' objects, each of its own class", arguments: StoreKind.allCases)
    func fetchIncludesSubentities(_ kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in Self.seed(in: context) }
        let context = ObjectContext(name: "fresh", parent: stack.store.store)
        try context.performAndWait {
            #expect(Self.describe(try Vehicle.all(in: context)) == ["Car:C1", "TowTruck:W1", "Truck:T1", "Vehicle:V1"])
            #expect(Self.describe(try Car.all(in: context)) == ["Car:C1"])
            #expect(Self.describe(try Truck.all(in: context)) == ["TowTruck:W1", "Truck:T1"])
            #expect(Self.describe(try TowTruck.all(in: context)) == ["TowTruck:W1"])
            #expect(try Vehicle.count(in: context) == 4)
            #expect(try Truck.count(in: context) == 2)
            #expect(try Car.count(in: context) == 1)
            // A predicate on the parent's properties applies to every subentity.
            #expect(Self.describe(try Vehicle.all(where: #Predicate { $0.wheels == 6 }, in: context)) == ["TowTruck:W1", "Truck:T1"])
            // On a subentity, inherited and own properties, sorted by an inherited one.
            let trucks = try context.fetch(FetchDescriptor<Truck>(
                predicate: #Predicate { $0.wheels == 6 && $0.payload >= 0 }, sortBy: [SortDescriptor(\.name, order: .reverse)]))
            #expect(trucks.map(\.name) == ["hook", "hauler"])
            let car = try #require(try Car.first(where: #Predicate { $0.doors == 2 && $0.name == "roadster" }, in: context))
            #expect(car.convertible && car.plate == "C1" && car.wheels == 4)
            let tow = try #require(try TowTruck.first(in: context))
            #expect(tow.hookRating == 9 && tow.payload == 0 && tow.wheels == 6)
            #expect(tow.objectID.entityName == "Vehicle")
        }
        // Relationships: to the parent holds any subentity; to a subentity; a subentity's own.
        let other = ObjectContext(name: "other", parent: stack.store.store)
        try other.performAndWait {
            let garage = try #require(try Garage.first(in: other))
            #expect(Self.describe(garage.vehicles) == ["Car:C1", "Truck:T1"])
            let favorite = try #require(garage.favorite)
            #expect(favorite.doors == 2)
            #expect(Self.describe(try Vehicle.all(where: #Predicate { $0.garage?.name == "central" }, in: other)) == ["Car:C1", "Truck:T1"])
            let truck = try #require(try Truck.first(where: #Predicate { $0.loads.count == 2 }, in: other))
            #expect(truck.loads.map(\.weight).sorted() == [1, 2])
            let load = try #require(try Load.first(in: other))
            #expect(load.truck?.plate == "T1")
        }
    }

    @Test("updates, deletes with a subentity's delete rule, and unique constraints across subentities", arguments: StoreKind.allCases)
    func savesAndConstraints(_ kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in Self.seed(in: context) }
        try stack.store.writeAndWait { context in
            let car = try #require(try Car.first(in: context))
            car.doors = 5
            car.name = "estate"
            let truck = try #require(try Truck.first(where: #Predicate { $0.plate == "T1" }, in: context))
            context.delete(truck)
        }
        let context = ObjectContext(name: "fresh", parent: stack.store.store)
        try context.performAndWait {
            let car = try #require(try Car.first(in: context))
            #expect(car.doors == 5 && car.name == "estate")
            #expect(try Load.count(in: context) == 0)  // cascaded from the truck
            #expect(Self.describe(try Vehicle.all(in: context)) == ["Car:C1", "TowTruck:W1", "Vehicle:V1"])
        }
        // A plate declared unique on the parent is unique across its subentities.
        let error = try #require(throws: SkyrosError.self) {
            try stack.store.writeAndWait { context in
                let truck = Truck.create(in: context)
                truck.plate = "C1"
            }
        }
        #expect(error.code == .uniqueConstraintViolation)
        #expect(try stack.store.mainContext.performAndWait { try Vehicle.count(in: stack.store.mainContext) } == 3)
    }
}
