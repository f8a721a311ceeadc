import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// Entity inheritance (`vehicleSchema` in SkyrosTestSupport): one table per hierarchy, on every stack.
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

    @Test(
        "one table per hierarchy: the root's entity holds every class's properties and _entity; the description lists the subentities"
    )
    func schemaShape() throws {
        try vehicleSchema.validate()
        #expect(vehicleSchema.entities.map(\.name) == ["Vehicle", "Garage", "Load"])
        let vehicle = try #require(vehicleSchema.entity(named: "Vehicle"))
        #expect(
            vehicle.properties.map(\.name) == [
                "plate", "name", "wheels", "garage", "doors", "convertible", "payload", "loads", "hookRating",
                "_entity",
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
        #expect(
            subentities == [
                SchemaDescription.Subentity(
                    name: "Car", parent: "Vehicle", properties: ["doors", "convertible"],
                    nonOptional: ["doors", "convertible"]),
                SchemaDescription.Subentity(
                    name: "Truck", parent: "Vehicle", properties: ["payload", "loads"], nonOptional: ["payload"]),
                SchemaDescription.Subentity(
                    name: "TowTruck", parent: "Truck", properties: ["hookRating"], nonOptional: ["hookRating"]),
            ])
        // A subentity's own columns may hold NULL (the other entities' rows), whatever their type;
        // nonOptional says which of them its own rows always fill.
        #expect(description.entities[0].properties.first { $0.name == "doors" }?.isOptional == true)
        #expect(description.entities[0].properties.first { $0.name == "wheels" }?.isOptional == false)
        let json = String(decoding: try description.canonicalJSON(), as: UTF8.self)
        #expect(
            json.contains(
                #""subentities":[{"name":"Car","nonOptional":["doors","convertible"],"parent":"Vehicle","properties":["doors","convertible"]},"#
            ))
        #expect(try Schema(description: description).fingerprint == vehicleSchema.fingerprint)
        let decoded = try JSONDecoder().decode(SchemaDescription.self, from: try description.canonicalJSON())
        #expect(try Schema(description: decoded).fingerprint == vehicleSchema.fingerprint)
        #expect(try SchemaDescription(json: Array(try description.canonicalJSON())) == description)
        #expect(vehicleSchema.fingerprintText.contains("subentity TowTruck < Truck: hookRating"))
    }

    @Test(
        "a subentity's fetch by an indexed inherited attribute goes through that attribute's index (which ends with _entity) and reads its entities' columns only"
    )
    func queryShape() throws {
        let stack = try stack(.sqlite)
        try stack.store.writeAndWait { context in Self.seed(in: context) }
        let sqlite = try #require(stack.store.store as? SQLiteStore)
        let request = try FetchDescriptor<Car>(predicate: #Predicate { $0.wheels == 4 }).storeRequest(
            schema: vehicleSchema)
        let (sql, arguments) = try sqlite.sql(for: request)
        #expect(sql.contains(#"WHERE (+(t0."_entity" IN (?)) AND "#), "\(sql)")
        #expect(
            sql.hasPrefix(
                #"SELECT t0."_id", t0."_version", t0."plate", t0."name", t0."wheels", t0."garage", t0."doors", t0."convertible" FROM"#
            ), "\(sql)")
        let plan = try sqlite.rows("EXPLAIN QUERY PLAN " + sql, arguments).map { "\($0[3])" }.joined(separator: "; ")
        #expect(plan.contains("USING INDEX Vehicle_wheels"), "\(plan)")
        let indexes = try sqlite.rows("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'Vehicle'").map
        { row in
            if case .text(let sql) = row[0] { sql } else { "" }
        }
        #expect(indexes.contains(#"CREATE INDEX "Vehicle_wheels" ON "Vehicle" ("wheels", "_entity")"#), "\(indexes)")
        #expect(indexes.contains(#"CREATE UNIQUE INDEX "Vehicle_plate" ON "Vehicle" ("plate")"#), "\(indexes)")
        // A fetch of a subentity with subentities reads _entity (its objects are of two classes).
        let trucks = try sqlite.sql(for: FetchDescriptor<Truck>().storeRequest(schema: vehicleSchema)).sql
        #expect(
            trucks.contains(#"t0."payload", t0."hookRating", t0."_entity" FROM"#) && !trucks.contains("doors"),
            "\(trucks)")
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
            #expect(
                Self.describe(try Vehicle.all(where: #Predicate { $0.wheels == 6 }, in: context)) == [
                    "TowTruck:W1", "Truck:T1",
                ])
            // On a subentity, inherited and own properties, sorted by an inherited one.
            let trucks = try context.fetch(
                FetchDescriptor<Truck>(
                    predicate: #Predicate { $0.wheels == 6 && $0.payload >= 0 },
                    sortBy: [SortDescriptor(\.name, order: .reverse)]))
            #expect(trucks.map(\.name) == ["hook", "hauler"])
            let car = try #require(
                try Car.first(where: #Predicate { $0.doors == 2 && $0.name == "roadster" }, in: context))
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
            #expect(
                Self.describe(try Vehicle.all(where: #Predicate { $0.garage?.name == "central" }, in: other)) == [
                    "Car:C1", "Truck:T1",
                ])
            let truck = try #require(try Truck.first(where: #Predicate { $0.loads.count == 2 }, in: other))
            #expect(truck.loads.map(\.weight).sorted() == [1, 2])
            let load = try #require(try Load.first(in: other))
            #expect(load.truck?.plate == "T1")
        }
    }

    @Test(
        "unsaved objects of subentities are fetched, counted and filtered as saved ones", arguments: StoreKind.allCases)
    func pendingObjects(_ kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in Self.seed(in: context) }
        let main = stack.store.mainContext
        try main.performAndWait {
            let car = Car.create(in: main)
            car.plate = "C2"
            car.wheels = 6
            TowTruck.create(in: main).plate = "W2"
            try #require(try Truck.first(where: #Predicate { $0.plate == "T1" }, in: main)).wheels = 8
            #expect(Self.describe(try Car.all(in: main)) == ["Car:C1", "Car:C2"])
            #expect(Self.describe(try Truck.all(in: main)) == ["TowTruck:W1", "TowTruck:W2", "Truck:T1"])
            #expect(try Vehicle.count(in: main) == 6)
            #expect(try TowTruck.count(in: main) == 2)
            #expect(
                Self.describe(try Vehicle.all(where: #Predicate { $0.wheels >= 6 }, in: main)) == [
                    "Car:C2", "TowTruck:W1", "Truck:T1",
                ])
            #expect(Self.describe(try Car.all(where: #Predicate { $0.wheels >= 6 }, in: main)) == ["Car:C2"])
            main.rollback()
        }
    }

    @Test(
        "updates, deletes with a subentity's delete rule, and unique constraints across subentities",
        arguments: StoreKind.allCases)
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
        // deleteAll of a subentity: its objects (of its subentities too), nothing else.
        try stack.store.writeAndWait { context in try TowTruck.deleteAll(in: context) }
        #expect(
            try stack.store.read { context in Self.describe(try Vehicle.all(in: context)) } == ["Car:C1", "Vehicle:V1"])
        try stack.store.writeAndWait { context in try Vehicle.deleteAll(in: context) }
        #expect(try stack.store.read { context in try Vehicle.count(in: context) } == 0)
    }

    @Test("batch updates and deletes of a subentity touch its rows only; aggregates over a subentity")
    func batchOperations() async throws {
        let stack = try stack(.sqlite)
        try stack.store.writeAndWait { context in Self.seed(in: context) }
        #expect(
            try await stack.store.batchUpdate(Truck.self, where: #Predicate { $0.wheels == 6 }, .set(\.name, to: "big"))
                == 2)
        #expect(try await stack.store.batchUpdate(Car.self, .set(\.doors, to: 3)) == 1)
        let names = try await stack.store.read { context in
            try Vehicle.all(in: context).map { "\($0.plate)=\($0.name)" }.sorted()
        }
        #expect(names == ["C1=roadster", "T1=big", "V1=cart", "W1=big"])
        let wheels = try await stack.store.read { context in try Truck.sum(\.wheels, in: context) }
        #expect(wheels == 12)
        #expect(try await stack.store.batchDelete(Truck.self, where: #Predicate { $0.payload > 1 }) == 1)
        let left = try await stack.store.read { context in Self.describe(try Vehicle.all(in: context)) }
        #expect(left == ["Car:C1", "TowTruck:W1", "Vehicle:V1"])
        #expect(try await stack.store.read { context in try Load.count(in: context) } == 0)
        #expect(try await stack.store.read { context in try Car.first(in: context)?.doors } == 3)
    }

    final class Reported: @unchecked Sendable {
        var changes: [[String]] = []
    }

    static func describe(_ change: FetchedResultsObjectChange<Car>) -> String {
        switch change {
        case .insert(let object, _): "insert \(object.plate)"
        case .delete(let object, _): "delete \(object.plate)"
        case .update(let object, _): "update \(object.plate)"
        case .move(let object, _, _): "move \(object.plate)"
        }
    }

    @Test(
        "a controller on a subentity reports its objects only; a monitor of a parent reports its subentities' objects",
        arguments: StoreKind.allCases)
    func observation(_ kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in Self.seed(in: context) }
        let main = stack.store.mainContext
        let controller = FetchedResultsController(
            fetch: FetchDescriptor<Car>(sortBy: [SortDescriptor(\.plate)]), context: main)
        try controller.performFetch()
        #expect(controller.fetchedObjects.map(\.plate) == ["C1"])
        let reported = Reported()
        controller.onChange = { changes in reported.changes.append(changes.objects.map(Self.describe)) }
        let monitor = EntityMonitor<Truck>(context: main)
        let trucks = Reported()
        monitor.onChange = { change in
            trucks.changes.append(InheritanceTests.describe(change.inserted + change.updated))
        }
        try stack.store.writeAndWait { context in
            let car = Car.create(in: context)
            car.plate = "C2"
            Truck.create(in: context).plate = "T2"
            TowTruck.create(in: context).plate = "W2"
            Vehicle.create(in: context).plate = "V2"
        }
        #expect(controller.fetchedObjects.map(\.plate) == ["C1", "C2"])
        #expect(reported.changes == [["insert C2"]])
        #expect(trucks.changes == [["TowTruck:W2", "Truck:T2"]])
        // An update of an inherited property of a car; a truck's change is not the controller's.
        try stack.store.writeAndWait { context in
            try #require(try Car.first(where: #Predicate { $0.plate == "C1" }, in: context)).wheels = 3
            try #require(try Truck.first(where: #Predicate { $0.plate == "T2" }, in: context)).payload = 1
        }
        #expect(reported.changes.last == ["update C1"])
        #expect(reported.changes.count == 2)
        #expect(trucks.changes.last == ["Truck:T2"])
    }

    @Test("undo and redo of a subentity's insert and edit", arguments: StoreKind.allCases)
    func undo(_ kind: StoreKind) throws {
        let stack = try stack(kind)
        let main = stack.store.mainContext
        let undo = UndoManager()
        main.undoManager = undo
        let car = main.performAndWait {
            let car = Car.create(in: main)
            car.plate = "C1"
            car.doors = 3
            return car
        }
        main.performAndWait { car.doors = 5 }
        try main.performAndWait {
            undo.undo()
            #expect(car.doors == 3)
            undo.undo()
            let count = try Car.count(in: main)
            #expect(count == 0)
            undo.redo()
            let redone = try Car.first(in: main)
            #expect(redone?.doors == 3)
            let vehicle = try Vehicle.first(in: main)
            #expect(vehicle.map { type(of: $0) == Car.self } == true)
        }
        try stack.store.saveMainContext()
        let fresh = ObjectContext(name: "fresh", parent: stack.store.store)
        #expect(try fresh.performAndWait { try Car.first(in: fresh).map { "\($0.plate) \($0.doors)" } } == "C1 3")
    }

    /// Every vehicle with its class and values, every garage with its vehicles and favourite,
    /// every load with its truck, as a context sees them.
    static func fullGraph(_ context: ObjectContext) throws -> String {
        try context.performAndWait {
            let vehicles = try Vehicle.all(in: context).map { vehicle -> String in
                var text = "\(type(of: vehicle)):\(vehicle.plate):\(vehicle.wheels):\(vehicle.garage?.name ?? "-")"
                if let car = vehicle as? Car { text += ":\(car.doors)" }
                if let truck = vehicle as? Truck { text += ":\(truck.payload):\(truck.loads.map(\.weight).sorted())" }
                if let tow = vehicle as? TowTruck { text += ":\(tow.hookRating)" }
                return text
            }.sorted()
            let garages = try Garage.all(in: context).map {
                "\($0.name):\($0.vehicles.map(\.plate).sorted()):\($0.favorite?.plate ?? "-")"
            }.sorted()
            return (vehicles + garages + [String(try Load.count(in: context))]).joined(separator: " ")
        }
    }

    @Test(
        "seeded random inserts of every class, edits of inherited and own properties, relationships, deletes, undos and redos: each save stores what the main context shows",
        arguments: StoreKind.allCases)
    func randomSequences(_ kind: StoreKind) throws {
        let stack = try stack(kind)
        let main = stack.store.mainContext
        let undo = UndoManager()
        main.undoManager = undo
        // VEHICLE_SEED=<n> explores another sequence.
        let sequence = UndoSequence(
            edits: 10, undos: 3, redos: 2, steps: 120, seedVariable: "VEHICLE_SEED", seed: 0x5EED_CA75)
        let counts = try sequence.run(stack, undo, graph: Self.fullGraph) { choice, serial, generator in
            let vehicles = try Vehicle.all(in: main).sorted { $0.plate < $1.plate }
            let garages = try Garage.all(in: main).sorted { $0.name < $1.name }
            switch choice {
            case 0: Vehicle.create(in: main).plate = "V\(serial)"
            case 1:
                let car = Car.create(in: main)
                car.plate = "C\(serial)"
                car.doors = serial % 5
            case 2: Truck.create(in: main).plate = "T\(serial)"
            case 3: TowTruck.create(in: main).plate = "W\(serial)"
            case 4: Garage.create(in: main).name = "g\(serial)"
            case 5:  // an inherited property, or a subentity's own
                guard let vehicle = vehicles.randomElement(using: &generator) else { return false }
                switch vehicle {
                case let car as Car: car.doors += 1
                case let tow as TowTruck: tow.hookRating += 1
                default: vehicle.wheels += 1
                }
            case 6:  // into a garage, or the favourite car
                guard let garage = garages.randomElement(using: &generator),
                    let vehicle = vehicles.randomElement(using: &generator)
                else { return false }
                if let car = vehicle as? Car, Bool.random(using: &generator) {
                    garage.favorite = car
                } else {
                    vehicle.garage = garage
                }
            case 7:  // a load on a truck
                guard let truck = vehicles.compactMap({ $0 as? Truck }).randomElement(using: &generator) else {
                    return false
                }
                let load = Load.create(in: main)
                load.weight = Double(serial)
                load.truck = truck
            case 8:
                guard let vehicle = vehicles.randomElement(using: &generator) else { return false }
                main.delete(vehicle)  // a truck's loads go with it
            default:
                guard let garage = garages.randomElement(using: &generator) else { return false }
                main.delete(garage)
            }
            return true
        }
        #expect(counts.edits > 50 && counts.undos > 5 && counts.saves > 30, "\(counts)")
    }

    @Test("a child context of the main context: faults of subentities are made of their classes")
    func childContexts() throws {
        let stack = try stack(.sqlite)
        try stack.store.writeAndWait { context in Self.seed(in: context) }
        let main = stack.store.mainContext
        let child = ObjectContext(name: "child", parent: main)
        try child.performAndWait {
            let load = try #require(try Load.first(in: child))
            let truck = try #require(load.truck)
            #expect(type(of: truck) == Truck.self)
            #expect(truck.payload == 12.5)
            let garage = try #require(try Garage.first(in: child))
            #expect(type(of: try #require(garage.favorite)) == Car.self)
            let car = Car.create(in: child)
            car.plate = "C7"
            garage.favorite = car
            try child.save()
        }
        try main.performAndWait {
            #expect(try Garage.first(in: main)?.favorite?.plate == "C7")
            try main.save()
        }
        #expect(try stack.store.read { context in try Garage.first(in: context)?.favorite?.plate } == "C7")
    }

    @Test("turning an entity into a hierarchy and adding a subentity are inferred migrations; the data is kept")
    func migrations() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(
                sqliteStack: Schema([VehicleV1.self, GarageV1.self, LoadV1.self]), at: url, savesOnStop: false)
            try store.writeAndWait { context in
                let garage = GarageV1.create(in: context)
                garage.name = "g"
                for plate in ["A", "B"] {
                    let vehicle = VehicleV1.create(in: context)
                    vehicle.plate = plate
                    vehicle.garage = garage
                }
            }
        }
        // Version 2: Vehicle gets its first subentity, Car.
        do {
            let schema = Schema([Vehicle.self, Car.self, Garage.self, LoadV1.self], version: 2)
            try schema.validate()
            let store = try Skyros(sqliteStack: schema, at: url, savesOnStop: false)
            try store.writeAndWait { context in
                #expect(Self.describe(try Vehicle.all(in: context)) == ["Vehicle:A", "Vehicle:B"])
                #expect(try Car.count(in: context) == 0)
                let car = Car.create(in: context)
                car.plate = "C"
                car.doors = 2
                car.garage = try Garage.first(in: context)
            }
        }
        // Version 3: Truck and TowTruck added under it.
        do {
            let store = try Skyros(
                sqliteStack: Schema(
                    [Vehicle.self, Car.self, Truck.self, TowTruck.self, Garage.self, Load.self], version: 3), at: url,
                savesOnStop: false)
            try store.writeAndWait { context in
                let all = try Vehicle.all(in: context)
                #expect(Self.describe(all) == ["Car:C", "Vehicle:A", "Vehicle:B"])
                let car = try Car.first(in: context)
                #expect(car?.doors == 2)
                let garage = try Garage.first(in: context)
                #expect(Self.describe(garage?.vehicles ?? []) == ["Car:C", "Vehicle:A", "Vehicle:B"])
                TowTruck.create(in: context).plate = "W"
            }
            #expect(try store.read { context in Self.describe(try Truck.all(in: context)) } == ["TowTruck:W"])
            try store.writeAndWait { context in
                let truck = Truck.create(in: context)
                truck.plate = "T"
                truck.payload = 3
            }
        }
        // Version 4: TowTruck removed. Its object becomes a Truck (what it inherited stays).
        do {
            let v4 = try Skyros(
                sqliteStack: Schema([Vehicle.self, Car.self, Truck.self, Garage.self, Load.self], version: 4), at: url,
                savesOnStop: false)
            #expect(
                try v4.read { context in Self.describe(try Vehicle.all(in: context)) } == [
                    "Car:C", "Truck:T", "Truck:W", "Vehicle:A", "Vehicle:B",
                ])
        }
        // Version 5: no subentity left: Vehicle is a flat entity again, every object kept.
        let v5 = try Skyros(
            sqliteStack: Schema([VehicleV1.self, GarageV1.self, LoadV1.self], version: 5), at: url, savesOnStop: false)
        #expect(
            try v5.read { context in try VehicleV1.all(in: context).map(\.plate).sorted() } == [
                "A", "B", "C", "T", "W",
            ])
    }

    @Test("skyros dump lists a hierarchy's rows with their _entity; skyros import brings each back as its class")
    func dumpAndImport() throws {
        let directory = try TemporaryDirectory()
        let source = directory.file("source.sqlite")
        do {
            let store = try Skyros(sqliteStack: vehicleSchema, at: source, savesOnStop: false)
            try store.writeAndWait { context in Self.seed(in: context) }
        }
        let dump = try OperatingToolTests.run(["dump", "--store", source.path])
        #expect(dump.status == 0, "\(dump.stderr)")
        let vehicles = dump.jsonLines.filter { $0["entity"] as? String == "Vehicle" }
        #expect(vehicles.count == 4)
        let file = directory.file("dump.jsonl").path
        try dump.stdout.write(toFile: file, atomically: true, encoding: .utf8)
        let copy = directory.file("copy.sqlite")
        try SQLiteStore(schema: vehicleSchema, url: copy).close()
        let imported = try OperatingToolTests.run(["import", file, "--store", copy.path])
        #expect(imported.status == 0, "\(imported.stderr)")
        let store = try Skyros(sqliteStack: vehicleSchema, at: copy, savesOnStop: false)
        #expect(
            try store.read { context in Self.describe(try Vehicle.all(in: context)) } == [
                "Car:C1", "TowTruck:W1", "Truck:T1", "Vehicle:V1",
            ])
        #expect(try store.read { context in try TowTruck.first(in: context)?.hookRating } == 9)
    }

    @Test(
        "two client processes through skyrosd: objects of subentities made in one are of their classes in the other, and reach its controller and monitor"
    )
    func acrossProcesses() async throws {
        let stack = try stack(.shared)
        let container = try #require(stack.daemon).container.url
        try stack.store.writeAndWait { context in Self.seed(in: context) }
        let main = stack.store.mainContext
        let controller = FetchedResultsController(
            fetch: FetchDescriptor<Car>(sortBy: [SortDescriptor(\.plate)]), context: main)
        try controller.performFetch()
        let reported = Reported()
        controller.onChange = { changes in reported.changes.append(changes.objects.map(Self.describe)) }
        let changes = stack.store.changes
        let child = try ChildProcess(["add-vehicles", container.path])
        #expect(await child.wait(seconds: 30) == .exited(0), "\(child.readAll())")
        #expect(await nextChange(changes, seconds: 10) != nil)
        #expect(controller.fetchedObjects.map(\.plate) == ["C1", "C9"])
        #expect(reported.changes == [["insert C9"]])
        let seen = try main.performAndWait { Self.describe(try Vehicle.all(in: main)) }
        #expect(seen == ["Car:C1", "Car:C9", "TowTruck:W1", "TowTruck:W9", "Truck:T1", "Vehicle:V1"])
        #expect(
            try main.performAndWait { try TowTruck.first(where: #Predicate { $0.plate == "W9" }, in: main)?.hookRating }
                == 4)
    }
}

extension InheritanceTests {
    static func describe(_ objects: [Truck]) -> [String] { describe(objects.map { $0 as Vehicle }) }
}

/// Problems a review found in the first version, each with the scenario that showed it.
@Suite("Entity inheritance: review regressions", .timeLimit(.minutes(3)))
struct InheritanceReviewTests {
    @Test(
        "an object a child cannot read (deleted, unsaved, in its parent) is not registered with a guessed class: fetched again after the parent's rollback, it is a Car"
    )
    func unreadableFaultNotRegistered() throws {
        let stack = try TestStack(.sqlite, schema: vehicleSchema)
        try stack.store.writeAndWait { context in InheritanceTests.seed(in: context) }
        let main = stack.store.mainContext
        let child = ObjectContext(name: "child", parent: main)
        try main.performAndWait { main.delete(try #require(try Car.first(in: main))) }
        try child.performAndWait {
            let garage = try #require(try Garage.first(in: child))
            _ = garage.favorite  // unreadable: deleted in the parent
        }
        main.performAndWait { main.rollback() }
        try child.performAndWait {
            let cars = try Car.all(in: child)
            #expect(cars.map(\.plate) == ["C1"])
            #expect(try Vehicle.all(in: child).count == 4)
        }
    }

    @Test(
        "a subentity's required to-one binds its objects only; its new non-optional attribute gets its default in its rows only; aggregates over unsaved subentity objects"
    )
    func subentityColumns() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(
                sqliteStack: Schema([Vehicle.self, Car.self, Truck.self, Garage.self, Load.self]), at: url,
                savesOnStop: false)
            try store.writeAndWait { context in
                Truck.create(in: context).plate = "T1"
                Vehicle.create(in: context).plate = "V1"
            }
        }
        let schema = Schema([Vehicle.self, CarV2.self, Truck.self, Garage.self, Load.self], version: 2)
        // Car.doors Int and Int? are two models: their fingerprints differ.
        #expect(schema.fingerprint != Schema([Vehicle.self, Car.self, Truck.self, Garage.self, Load.self]).fingerprint)
        #expect(try Schema(description: schema.schemaDescription).fingerprint == schema.fingerprint)
        let store = try Skyros(sqliteStack: schema, at: url, savesOnStop: false)  // no car: the required to-one is inferred
        try store.writeAndWait { context in
            Truck.create(in: context).plate = "T2"  // saved without a registeredAt: not a car's
            let car = CarV2.create(in: context)
            car.plate = "C1"
            car.registeredAt = Garage.create(in: context)
        }
        let error = try #require(throws: SkyrosError.self) {
            try store.writeAndWait { context in CarV2.create(in: context).plate = "C2" }
        }
        #expect(error.code == .missingRequiredRelationship)
        let colors = try store.read { context in try CarV2.all(in: context).map(\.color) }
        #expect(colors == ["red"])
        let sqlite = try #require(store.store as? SQLiteStore)
        #expect(try sqlite.rows(#"SELECT count(*) FROM "Vehicle" WHERE "color" IS NULL"#)[0][0] == .integer(3))
        try store.mainContext.performAndWait {
            let main = store.mainContext
            let car = CarV2.create(in: main)
            car.plate = "C3"
            car.doors = 7
            car.registeredAt = try Garage.first(in: main)
            #expect(try CarV2.sum(\.doors, in: main) == 11)
            #expect(try Vehicle.sum(\.wheels, in: main) == 20)
            main.rollback()
        }
    }

    @Test(
        "a relationship controller whose destination is a subentity reports its changes", arguments: StoreKind.allCases)
    func relationshipToSubentity(_ kind: StoreKind) throws {
        let stack = try TestStack(kind, schema: petSchema)
        try stack.store.writeAndWait { context in
            let keeper = Keeper.create(in: context)
            keeper.name = "k"
            let dog = Dog.create(in: context)
            dog.name = "rex"
            dog.keeper = keeper
            Cat.create(in: context).name = "tom"
        }
        let main = stack.store.mainContext
        let keeper = try #require(try main.performAndWait { try Keeper.first(in: main) })
        let controller = FetchedResultsController(relationship: \Keeper.dogs, of: keeper, context: main)
        try controller.performFetch()
        #expect(controller.fetchedObjects.map(\.name) == ["rex"])
        let reported = InheritanceTests.Reported()
        controller.onChange = { changes in
            reported.changes.append(changes.objects.map { "\($0)".contains("insert") ? "insert" : "other" })
        }
        try stack.store.writeAndWait { context in
            let dog = Dog.create(in: context)
            dog.name = "fido"
            dog.keeper = try Keeper.first(in: context)
            Cat.create(in: context).name = "kit"
        }
        #expect(controller.fetchedObjects.map(\.name) == ["rex", "fido"])
        #expect(reported.changes == [["insert"]])
        #expect(
            try main.performAndWait { try Pet.all(in: main).map { "\(type(of: $0)):\($0.name)" }.sorted() } == [
                "Cat:kit", "Cat:tom", "Dog:fido", "Dog:rex",
            ])
    }

    @Test(
        "a non-optional attribute added to a subentity with objects: they get its default, the other entities' rows NULL"
    )
    func addedAttributeFilled() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(
                sqliteStack: Schema([Vehicle.self, Car.self, Truck.self, Garage.self, Load.self]), at: url,
                savesOnStop: false)
            try store.writeAndWait { context in
                Car.create(in: context).plate = "C1"
                Truck.create(in: context).plate = "T1"
            }
        }
        let store = try Skyros(
            sqliteStack: Schema([Vehicle.self, CarV3.self, Truck.self, Garage.self, Load.self], version: 2), at: url,
            savesOnStop: false)
        #expect(try store.read { context in try CarV3.all(in: context).map(\.color) } == ["red"])
        let sqlite = try #require(store.store as? SQLiteStore)
        #expect(try sqlite.rows(#"SELECT "_entity" FROM "Vehicle" WHERE "color" IS NULL"#) == [[.text("Truck")]])
    }

    @Test(
        "renaming a subentity keeps its objects; a flat entity becoming a subentity is refused, the store left as it was"
    )
    func renamesAndMoves() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(
                sqliteStack: Schema([Vehicle.self, Car.self, GarageV1.self, LoadV1.self]), at: url, savesOnStop: false)
            try store.writeAndWait { context in Car.create(in: context).plate = "C1" }
        }
        do {
            let store = try Skyros(
                sqliteStack: Schema([Vehicle.self, Coupe.self, GarageV1.self, LoadV1.self], version: 2), at: url,
                savesOnStop: false)
            let coupes = try store.read { context in try Coupe.all(in: context).map(\.plate) }
            #expect(coupes == ["C1"])
        }
        let flat = directory.file("flat.sqlite")
        do {
            let store = try Skyros(
                sqliteStack: Schema([VehicleV1.self, FlatCar.self, GarageV1.self, LoadV1.self]), at: flat,
                savesOnStop: false)
            try store.writeAndWait { context in FlatCar.create(in: context).doors = 3 }
        }
        let error = try #require(throws: SkyrosError.self) {
            _ = try Skyros(
                sqliteStack: Schema([Vehicle.self, Car.self, GarageV1.self, LoadV1.self], version: 2), at: flat,
                savesOnStop: false)
        }
        #expect(error.code == .migrationFailed)
        #expect(error.message.contains("Car becomes a subentity of Vehicle"), "\(error.message)")
        let kept = try Skyros(
            sqliteStack: Schema([VehicleV1.self, FlatCar.self, GarageV1.self, LoadV1.self]), at: flat,
            savesOnStop: false)
        #expect(try kept.read { context in try FlatCar.first(in: context)?.doors } == 3)
    }
}
