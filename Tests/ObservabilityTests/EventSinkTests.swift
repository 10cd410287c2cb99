import Foundation
import RequestEngine
import Testing

@testable import Observability

/// Records what it saw, tagged with its name, into a shared journal.
struct JournalSink: RequestEventSink {
    let name: String
    let journal: LockedBox<[String]>

    func record(_ event: RequestEvent) async {
        journal.mutate { $0.append("\(name):\(event.kindName)") }
    }
}

extension RequestEvent {
    var kindName: String {
        switch self {
        case .started: "started"
        case .retryScheduled: "retry"
        case .succeeded: "succeeded"
        case .failed: "failed"
        case .deduplicated: "dedup"
        }
    }
}

@Suite("Sinks: fan-out, closure, logging")
struct EventSinkTests {
    let secretURL = url("https://bob:PA55W0RD@api.example.com:8443/v1/users/42;jsessionid=SESSION9?access_token=T0KEN&x=1#FRAG")

    @Test func fanOutRecordsEachEventToEverySinkInOrder() async {
        let journal = LockedBox<[String]>([])
        let collector = RequestMetricsCollector()
        let fanOut = FanOutEventSink(
            JournalSink(name: "a", journal: journal),
            collector,
            JournalSink(name: "b", journal: journal),
            ClosureEventSink { event in journal.mutate { $0.append("c:\(event.kindName)") } }
        )
        let id = UUID()
        await fanOut.record(.started(traceID: id, url: secretURL, method: .get))
        await fanOut.record(.succeeded(traceID: id, statusCode: 200, duration: 0.1, attempt: 0))
        #expect(journal.value == ["a:started", "b:started", "c:started", "a:succeeded", "b:succeeded", "c:succeeded"])
        #expect(collector.currentSnapshot().requestsSucceeded == 1)
        #expect(FanOutEventSink([]).sinks.isEmpty)
    }

    @Test func closureSinkSeesEveryEventInOrder() async {
        let journal = LockedBox<[String]>([])
        let sink = ClosureEventSink { event in journal.mutate { $0.append(event.kindName) } }
        let id = UUID()
        for event: RequestEvent in [
            .started(traceID: id, url: secretURL, method: .get),
            .retryScheduled(traceID: id, attempt: 0, delay: 1),
            .failed(traceID: id, error: .timedOut, attempt: 1),
            .deduplicated(traceID: UUID(), url: secretURL, method: .get),
        ] {
            await sink.record(event)
        }
        #expect(journal.value == ["started", "retry", "failed", "dedup"])
    }

    @Test func loggingSinkWritesOneRedactedLinePerEvent() async {
        let lines = LockedBox<[String]>([])
        let sink = LoggingEventSink(label: "app") { line in lines.mutate { $0.append(line) } }
        let id = UUID(uuidString: "00000000-0000-0000-0000-00000000002A") ?? UUID()
        await sink.record(.started(traceID: id, url: secretURL, method: .get))
        await sink.record(.retryScheduled(traceID: id, attempt: 0, delay: 0.25))
        await sink.record(.succeeded(traceID: id, statusCode: 200, duration: 0.3184, attempt: 1))
        await sink.record(.failed(traceID: id, error: .httpError(statusCode: 503, data: Data("secret body".utf8)), attempt: 2))
        await sink.record(.deduplicated(traceID: id, url: secretURL, method: .post))

        let trace = "trace=00000000-0000-0000-0000-00000000002A"
        #expect(
            lines.value == [
                "app event=started \(trace) method=GET url=https://api.example.com:8443/v1/users/42",
                "app event=retry_scheduled \(trace) attempt=0 delay=0.250",
                "app event=succeeded \(trace) status=200 attempt=1 duration=0.318",
                "app event=failed \(trace) attempt=2 error=\"HTTP 503 (11 body bytes)\"",
                "app event=deduplicated \(trace) method=POST url=https://api.example.com:8443/v1/users/42",
            ])
        let all = lines.value.joined(separator: "\n")
        for secret in ["bob", "PA55W0RD", "SESSION9", "T0KEN", "access_token", "FRAG", "secret body"] {
            #expect(!all.contains(secret), "\(secret) leaked into the log")
        }
    }

    @Test func loggingSinkCanLogTemplatesInsteadOfPaths() async {
        let lines = LockedBox<[String]>([])
        let sink = LoggingEventSink(pathTemplate: .collapsingIdentifiers) { line in lines.mutate { $0.append(line) } }
        await sink.record(.started(traceID: UUID(), url: secretURL, method: .get))
        #expect(lines.value.first?.hasSuffix("url=https://api.example.com:8443/v1/users/{id}") == true)
        #expect(lines.value.first?.hasPrefix("resilience event=started") == true)
    }

    @Test func loggingSinkQuotesValuesThatWouldBreakTheLine() async {
        let lines = LockedBox<[String]>([])
        let sink = LoggingEventSink { line in lines.mutate { $0.append(line) } }
        await sink.record(.failed(traceID: UUID(), error: .invalidRequest(reason: "bad \"value\"\nnext=line"), attempt: 0))
        let line = lines.value.first ?? ""
        #expect(!line.contains("\n"))
        #expect(line.hasSuffix(#"error="invalid request: bad \"value\"\nnext=line""#))
    }

    @Test func loggingSinkShowsOnlyThePathOfAHostlessURL() async {
        let lines = LockedBox<[String]>([])
        let sink = LoggingEventSink { line in lines.mutate { $0.append(line) } }
        await sink.record(.started(traceID: UUID(), url: url("relative/path?token=abc"), method: .get))
        #expect(lines.value.first?.hasSuffix("url=relative/path") == true)
    }
}
