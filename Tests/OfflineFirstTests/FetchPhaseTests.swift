import Testing

@testable import OfflineFirst

/// `LiveReadState.FetchPhase`, transition by transition: every event from every phase.
@Suite("LiveReadState.FetchPhase: a live read's fetching, transition by transition")
struct FetchPhaseTests {
    typealias Phase = LiveReadState.FetchPhase

    /// One of each phase, with every flag both ways.
    static let all: [Phase] = [
        .idle(nextFollowsDelivery: false), .idle(nextFollowsDelivery: true),
        .due(followsDelivery: false), .due(followsDelivery: true),
        .fetching(number: 3, next: .nothing),
        .fetching(number: 3, next: .due(followsDelivery: false)), .fetching(number: 3, next: .due(followsDelivery: true)),
    ]

    static func after(_ phase: Phase, _ change: (inout Phase) -> Void) -> Phase {
        var phase = phase
        change(&phase)
        return phase
    }

    @Test func aReadStartsDueWhenItHasAFetchToMakeAndIdleOtherwise() {
        #expect(Phase(fetchDue: true) == .due(followsDelivery: false))
        #expect(Phase(fetchDue: false) == .idle(nextFollowsDelivery: false))
    }

    @Test func aFetchIsDueAfterTheOneInFlightOrAtOnceAndOnlyThose() {
        #expect(Self.all.map(\.isDue) == [false, false, true, true, false, true, true])
        #expect(Self.all.map(\.fetchingNumber) == [nil, nil, nil, nil, 3, 3, 3])
    }

    /// A delivery asks for a fetch that reaches the origin; one in flight finishes first (it may
    /// carry the state from before the write).
    @Test func aDeliveryMakesAFetchDueThatReachesTheOrigin() {
        #expect(
            Self.all.map { Self.after($0) { $0.deliveryInvalidated() } } == [
                .due(followsDelivery: true), .due(followsDelivery: true),
                .due(followsDelivery: true), .due(followsDelivery: true),
                .fetching(number: 3, next: .due(followsDelivery: true)),
                .fetching(number: 3, next: .due(followsDelivery: true)), .fetching(number: 3, next: .due(followsDelivery: true)),
            ])
    }

    /// Reconnecting with a stale body asks for a fetch, keeping whether it must reach the origin.
    @Test func anotherAskMakesAFetchDueAndKeepsWhereItMustGo() {
        #expect(
            Self.all.map { Self.after($0) { $0.fetchAskedFor() } } == [
                .due(followsDelivery: false), .due(followsDelivery: true),
                .due(followsDelivery: false), .due(followsDelivery: true),
                .fetching(number: 3, next: .due(followsDelivery: false)),
                .fetching(number: 3, next: .due(followsDelivery: false)), .fetching(number: 3, next: .due(followsDelivery: true)),
            ])
    }

    @Test func startingAFetchSaysWhetherItFollowsADeliveryAndLeavesNothingDue() {
        var follows: [Bool] = []
        let started = Self.all.map { phase in
            Self.after(phase) { follows.append($0.start(4)) }
        }
        #expect(follows == [false, true, false, true, false, false, true])
        #expect(started.allSatisfy { $0 == .fetching(number: 4, next: .nothing) })
    }

    /// A landing with delivered writes it does not account for asks for another fetch at once; a
    /// failure only remembers that the next must reach the origin.
    @Test func theFetchInFlightEndingLeavesWhatItsLandingOrFailureCalls() {
        let ends: [(landed: Bool, settling: Bool)] = [(true, false), (true, true), (false, false), (false, true)]
        let from: [Phase] = [
            .fetching(number: 3, next: .nothing), .fetching(number: 3, next: .due(followsDelivery: false)),
            .fetching(number: 3, next: .due(followsDelivery: true)),
        ]
        let expected: [[Phase]] = [
            [.idle(nextFollowsDelivery: false), .due(followsDelivery: true), .idle(nextFollowsDelivery: false), .idle(nextFollowsDelivery: true)],
            [.due(followsDelivery: false), .due(followsDelivery: true), .due(followsDelivery: false), .due(followsDelivery: true)],
            [.due(followsDelivery: true), .due(followsDelivery: true), .due(followsDelivery: true), .due(followsDelivery: true)],
        ]
        for (phase, row) in zip(from, expected) {
            #expect(ends.map { end in Self.after(phase) { $0.ended(landed: end.landed, stillSettling: end.settling) } } == row, "from \(phase)")
        }
    }

    @Test func anEndWithNoFetchInFlightChangesNothing() {
        for phase in Self.all where phase.fetchingNumber == nil {
            #expect(Self.after(phase) { $0.ended(landed: true, stillSettling: true) } == phase)
        }
    }
}
