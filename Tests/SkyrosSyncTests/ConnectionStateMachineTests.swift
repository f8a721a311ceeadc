import Foundation
import Testing

@testable import SkyrosSync

/// The connection machine's transitions, as transcripts.
@Suite struct ConnectionStateMachineTests {
    @Test func offlineThenOnline() {
        var machine = ConnectionStateMachine(maximumRetryDelay: .seconds(5))
        #expect(machine.state == .offline)
        #expect(machine.start() == .connect)
        #expect(
            machine.failed(.offline, "cannot reach the server (connection refused)")
                == [
                    .report(.offline, "cannot reach the server (connection refused)"),
                    .retry(after: .milliseconds(100)),
                ])
        #expect(machine.retry() == .connect)
        // The same failure again is not reported again; the delay doubles up to its maximum.
        var delays: [Duration] = []
        for _ in 0..<7 {
            let actions = machine.failed(.offline, "cannot reach the server (connection refused)")
            #expect(actions.count == 1)
            if case .retry(let delay)? = actions.last { delays.append(delay) }
            #expect(machine.retry() == .connect)
        }
        #expect(
            delays == [
                .milliseconds(200), .milliseconds(400), .milliseconds(800), .milliseconds(1_600), .milliseconds(3_200),
                .seconds(5), .seconds(5),
            ])
        #expect(machine.sessionStarted() == .report(.online, nil))
        #expect(machine.state == .online)
        #expect(machine.message == nil)
        // Online once: the next failure waits the first delay again.
        #expect(
            machine.failed(.offline, "the connection to the server was closed")
                == [.report(.offline, "the connection to the server was closed"), .retry(after: .milliseconds(100))])
    }

    @Test func aServerThatComesBackIsConnectedToAtOnce() {
        var machine = ConnectionStateMachine(maximumRetryDelay: .seconds(5))
        _ = machine.start()
        // Down for a while: the delay has grown to its maximum.
        for _ in 0..<7 {
            _ = machine.failed(.offline, "cannot reach the server (connection refused)")
            #expect(machine.probes)
            #expect(machine.retry() == .connect)
        }
        #expect(
            machine.failed(.offline, "cannot reach the server (connection refused)") == [.retry(after: .seconds(5))])
        // The wait probes: refused, refused, then accepted: connect now, not in 5 s.
        #expect(machine.probes)
        #expect(machine.probed(reachable: false) == .none)
        #expect(machine.probed(reachable: false) == .none)
        #expect(machine.probes)
        #expect(machine.probed(reachable: true) == .connect)
        #expect(!machine.probes)
        // Found back, it starts again from the first delay (the server may still be starting).
        #expect(
            machine.failed(.offline, "the database system is starting up [SQLSTATE 57P03]") == [
                .report(.offline, "the database system is starting up [SQLSTATE 57P03]"),
                .retry(after: .milliseconds(100)),
            ])
    }

    @Test func aServerUpButFailingKeepsItsDelay() {
        var machine = ConnectionStateMachine(maximumRetryDelay: .seconds(5))
        _ = machine.sessionStarted()
        for _ in 0..<3 {
            _ = machine.failed(.offline, "the server did not answer within 10.0 seconds")
            #expect(machine.retry() == .connect)
        }
        #expect(
            machine.failed(.offline, "the server did not answer within 10.0 seconds") == [
                .retry(after: .milliseconds(800))
            ])
        // Accepting from the first probe: up, and failing otherwise; the wait is not cut
        // short, and there is no more probing in it.
        #expect(machine.probed(reachable: true) == .none)
        #expect(!machine.probes)
        #expect(machine.probed(reachable: false) == .none)
        #expect(machine.probed(reachable: true) == .none)
        #expect(machine.retry() == .connect)
        // The next wait probes again, and its delay has doubled.
        #expect(
            machine.failed(.offline, "the server did not answer within 10.0 seconds") == [
                .retry(after: .milliseconds(1_600))
            ])
        #expect(machine.probes)
    }

    @Test func anErrorIsNotProbedAndAStoppingEngineStopsAtAProbe() {
        var machine = ConnectionStateMachine()
        _ = machine.failed(.error, #"password authentication failed for user "skyros" [SQLSTATE 28P01]"#)
        // What an operator must fix is not fixed by a server coming back.
        #expect(!machine.probes)
        #expect(machine.probed(reachable: true) == .none)
        #expect(machine.retry() == .connect)
        _ = machine.failed(.offline, "cannot reach the server (connection refused)")
        #expect(machine.probes)
        machine.stop()
        #expect(machine.probed(reachable: false) == .stop)
        #expect(!machine.probes)
    }

    @Test func anErrorAnOperatorMustFixIsReportedAndTriedAgain() {
        var machine = ConnectionStateMachine()
        let message = #"password authentication failed for user "skyros" [SQLSTATE 28P01]"#
        #expect(machine.failed(.error, message) == [.report(.error, message), .retry(after: .milliseconds(100))])
        #expect(machine.state == .error)
        #expect(machine.retry() == .connect)
        #expect(
            machine.failed(.offline, "cannot reach the server") == [
                .report(.offline, "cannot reach the server"), .retry(after: .milliseconds(200)),
            ])
    }

    @Test func aStatementThatTimesOutIsOffline() throws {
        let configuration = SyncConfiguration(host: "db.example", username: "skyros", database: "skyros", schema: "g")
        let (state, message) = ServerErrors.classify(
            Watchdog.TimedOut(limit: .seconds(10)), configuration: configuration)
        #expect(state == .offline)
        #expect(message == "the server did not answer within 10.0 seconds")
        var machine = ConnectionStateMachine()
        _ = machine.sessionStarted()
        #expect(machine.failed(state, message) == [.report(.offline, message), .retry(after: .milliseconds(100))])
        let (closedState, _) = ServerErrors.classify(ServerSession.ConnectionClosed(), configuration: configuration)
        #expect(closedState == .offline)
    }

    @Test func aCheckpointTheStoreRefusesIsAnErrorUntilOneIsApplied() {
        var machine = ConnectionStateMachine()
        #expect(machine.sessionStarted() == .report(.online, nil))
        #expect(machine.storeFailed("disk full") == .report(.error, "disk full"))
        #expect(machine.storeFailed("disk full") == ConnectionStateMachine.Action.none)
        #expect(machine.checkpointApplied() == .report(.online, nil))
        #expect(machine.checkpointApplied() == ConnectionStateMachine.Action.none)
    }

    @Test func aStoppingEngineStopsWhereverItIs() {
        var machine = ConnectionStateMachine()
        machine.stop()
        #expect(machine.start() == .stop)
        #expect(machine.failed(.offline, "cannot reach the server") == [.stop])
        #expect(machine.retry() == .stop)
        #expect(machine.sessionEnded() == .stop)
    }

    @Test func aSessionThatEndsWithoutAnErrorIsTriedAgain() {
        var machine = ConnectionStateMachine()
        _ = machine.sessionStarted()
        #expect(machine.sessionEnded() == .retry(after: .milliseconds(100)))
    }
}
