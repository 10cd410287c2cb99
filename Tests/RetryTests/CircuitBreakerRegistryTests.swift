import Foundation
import ResilienceTestSupport
import ResilienceTesting
import Testing

@testable import Retry

@Suite("CircuitBreakerRegistry", .timeLimit(.minutes(1)))
struct CircuitBreakerRegistryTests {
    private let clock = ManualClock()

    private func registry(maximumBreakers: Int = 1_000) -> CircuitBreakerRegistry {
        CircuitBreakerRegistry(
            configuration: .init(windowSize: 4, minimumCalls: 2, failureRateThreshold: 0.5, openDuration: .seconds(30)),
            maximumBreakers: maximumBreakers,
            clock: clock
        )
    }

    private func fail(_ breaker: CircuitBreaker, times: Int) throws {
        for _ in 0..<times {
            breaker.record(.failure, for: try #require(breaker.acquire()))
        }
    }

    @Test func oneBreakerPerAuthorityMadeOnFirstUse() {
        let registry = registry()
        #expect(registry.hosts.isEmpty)
        let a = registry.breaker(forHost: "api.example.com")
        #expect(registry.breaker(forHost: "api.example.com") === a)
        #expect(registry.breaker(forHost: "API.Example.COM") === a)  // hosts compare lower-cased
        #expect(registry.breaker(forHost: "api.example.com:8443") !== a)  // another port, another breaker
        #expect(registry.hosts == ["api.example.com", "api.example.com:8443"])
        #expect(a.host == "api.example.com")
        #expect(a.configuration == registry.configuration)
    }

    @Test func authorityOfAURLIsTheLowerCasedHostAndItsExplicitPort() throws {
        #expect(CircuitBreakerRegistry.authority(of: try #require(URL(string: "https://API.example.com/a?b"))) == "api.example.com")
        #expect(CircuitBreakerRegistry.authority(of: try #require(URL(string: "http://example.com:8080/"))) == "example.com:8080")
        #expect(CircuitBreakerRegistry.authority(of: try #require(URL(string: "file:///tmp/x"))) == nil)
        let registry = registry()
        let url = try #require(URL(string: "https://Example.com:8443/path"))
        #expect(registry.breaker(for: url) === registry.breaker(forHost: "example.com:8443"))
    }

    /// The last key made is kept: asking again, or for another host or port in between, still
    /// gives each its own key.
    @Test func theKeptLastAuthorityNeverAnswersForAnotherHostOrPort() {
        let asked: [(String, Int?, String)] = [
            ("API.example.com", 8080, "api.example.com:8080"), ("API.example.com", 8080, "api.example.com:8080"),
            ("API.example.com", nil, "api.example.com"), ("api.example.com", 8080, "api.example.com:8080"),
            ("other.example", 8080, "other.example:8080"), ("API.example.com", 8081, "api.example.com:8081"),
        ]
        for (host, port, expected) in asked {
            #expect(CircuitBreakerRegistry.authority(host: host, port: port) == expected)
        }
    }

    @Test func aFailingHostDoesNotStopTheOthers() throws {
        let registry = registry()
        try fail(registry.breaker(forHost: "down.example"), times: 2)
        #expect(registry.breaker(forHost: "down.example").acquire() == nil)
        #expect(registry.breaker(forHost: "up.example").acquire() != nil)
        #expect(registry.states == ["down.example": .open, "up.example": .closed])
    }

    @Test func isolateAndResetByHost() {
        let registry = registry()
        registry.isolate(host: "Maintenance.example")  // makes the breaker, so the next call fails fast
        #expect(registry.breaker(forHost: "maintenance.example").acquire() == nil)
        #expect(registry.breaker(forHost: "maintenance.example").isIsolated)
        clock.advance(by: .seconds(3_600))
        #expect(registry.states["maintenance.example"] == .open)
        registry.reset(host: "MAINTENANCE.example")
        #expect(registry.states["maintenance.example"] == .closed)
        #expect(registry.breaker(forHost: "maintenance.example").acquire() != nil)
    }

    @Test func resettingAnUnknownHostMakesNoBreaker() {
        let registry = registry()
        registry.reset(host: "never.example")
        #expect(registry.hosts.isEmpty)
    }

    @Test func theMergedStreamCarriesEachBreakersHost() async throws {
        let registry = registry()
        let changes = StreamCollector(registry.stateChanges)
        try fail(registry.breaker(forHost: "a.example"), times: 2)
        registry.isolate(host: "b.example:81")
        registry.reset(host: "a.example")
        await changes.wait(for: 3)
        #expect(
            changes.items == [
                CircuitBreakerStateChange(host: "a.example", from: .closed, to: .open),
                CircuitBreakerStateChange(host: "b.example:81", from: .closed, to: .open),
                CircuitBreakerStateChange(host: "a.example", from: .open, to: .closed),
            ])
    }

    @Test func aBreakersOwnStreamCarriesItsHostToo() async {
        let registry = registry()
        let breaker = registry.breaker(forHost: "c.example")
        let changes = StreamCollector(breaker.stateChanges)
        breaker.isolate()
        await changes.wait(for: 1)
        #expect(changes.items == [CircuitBreakerStateChange(host: "c.example", from: .closed, to: .open)])
    }

    @Test func theRegistryKeepsAtMostMaximumBreakersDroppingTheLeastRecentlyUsed() {
        let registry = registry(maximumBreakers: 3)
        let a = registry.breaker(forHost: "a")
        _ = registry.breaker(forHost: "b")
        _ = registry.breaker(forHost: "c")
        _ = registry.breaker(forHost: "a")  // a is used again: b is now the oldest
        _ = registry.breaker(forHost: "d")
        #expect(registry.hosts == ["a", "c", "d"])
        #expect(registry.breaker(forHost: "a") === a)
    }

    @Test func isolatedBreakersAreNeverDropped() {
        let registry = registry(maximumBreakers: 2)
        registry.isolate(host: "isolated")
        for index in 0..<1_000 { _ = registry.breaker(forHost: "host\(index)") }
        #expect(registry.hosts.count == 2)
        #expect(registry.hosts.contains("isolated"))
        #expect(registry.breaker(forHost: "isolated").acquire() == nil)
    }

    @Test func twentyThousandHostsStayWithinTheBound() {
        let registry = registry(maximumBreakers: 64)
        for index in 0..<20_000 { _ = registry.breaker(forHost: "h\(index).example") }
        #expect(registry.hosts.count == 64)
    }

    @Test func hostileMaximumIsClamped() {
        let registry = registry(maximumBreakers: -1)
        #expect(registry.maximumBreakers == 1)
        _ = registry.breaker(forHost: "a")
        _ = registry.breaker(forHost: "b")
        #expect(registry.hosts == ["b"])
    }
}
