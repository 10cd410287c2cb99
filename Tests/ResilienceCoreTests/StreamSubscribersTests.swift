import Testing

@_spi(ResilienceCore) @testable import ResilienceCore

@Suite("StreamSubscribers: the streams one publisher hands out", .timeLimit(.minutes(1)))
struct StreamSubscribersTests {
    private func collect(_ stream: AsyncStream<Int>) async -> [Int] {
        var values: [Int] = []
        for await value in stream { values.append(value) }
        return values
    }

    @Test func everyStreamGetsItsFirstValueThenEveryYieldInOrder() async {
        let subscribers = StreamSubscribers<Int>()
        let a = subscribers.stream(first: 0)
        subscribers.yield(1)
        let b = subscribers.stream()
        subscribers.yield(2)
        subscribers.yield(3)
        #expect(subscribers.count == 2)
        subscribers.finishAll()
        #expect(subscribers.count == 0)
        #expect(await collect(a) == [0, 1, 2, 3])
        #expect(await collect(b) == [2, 3])
    }

    @Test func finishingTheCurrentStreamsLeavesNewerOnesLive() async {
        let subscribers = StreamSubscribers<Int>()
        let old = subscribers.stream()
        let ending = subscribers.current
        let newer = subscribers.stream()
        subscribers.finish(ending)
        subscribers.yield(7)
        #expect(subscribers.count == 1)
        #expect(await collect(old) == [])
        subscribers.finishAll()
        #expect(await collect(newer) == [7])
    }

    @Test func aStreamWhoseConsumerStopsLeavesAtOnce() async {
        let subscribers = StreamSubscribers<Int>()
        let stream = subscribers.stream()
        let (started, startedContinuation) = AsyncStream.makeStream(of: Void.self)
        let consumer = Task {
            startedContinuation.finish()
            for await _ in stream {}
        }
        for await _ in started {}
        consumer.cancel()
        await consumer.value
        #expect(subscribers.count == 0)
    }
}

extension StreamSubscribersTests {
    /// `yield` with nobody listening returns before it reads the streams: a stream made after all
    /// the others left, or after `finish`, still gets what is yielded from then on.
    @Test func yieldsReachAStreamMadeAfterEveryOtherLeft() async {
        let subscribers = StreamSubscribers<Int>()
        subscribers.yield(0)  // nobody listening
        let first = subscribers.stream()
        subscribers.finish(subscribers.current)
        subscribers.yield(1)  // nobody listening again
        let second = subscribers.stream()
        subscribers.yield(2)
        subscribers.finishAll()
        subscribers.yield(3)
        let third = subscribers.stream()
        subscribers.yield(4)
        subscribers.finishAll()
        #expect(await collect(first) == [])
        #expect(await collect(second) == [2])
        #expect(await collect(third) == [4])
    }
}
