import Foundation
import OfflineQueue
@_spi(ResilienceCore) import ResilienceCore
import Retry

/// One drain cycle: a queue pass bounded by a time budget. Shared by `DrainService` and
/// `BackgroundQueueDrainer`, so both stop in the same way when their time is up.
enum DrainCycle {
    private enum Event: Sendable {
        case flushed(FlushReport)
        case budgetElapsed
        case timerStopped
    }

    /// Runs `queue.flush()` until it ends, the budget elapses on `time`, or the calling task is
    /// cancelled — whichever comes first. Budget and cancellation end the pass cooperatively: the
    /// request in flight is cancelled and its entry stays queued, unattempted, with its
    /// idempotency key, so the next cycle sends it again (at least once). With
    /// `flushMode: .ignoringReachability`, the pass sends even while the queue's monitor says offline.
    static func run(
        queue: OfflineQueueEngine,
        trigger: DrainCycleReport.Trigger,
        budget: Duration?,
        time: TimeSource,
        flushMode: OfflineQueueEngine.FlushMode = .followingReachability
    ) async -> DrainCycleReport {
        let startedAt = queue.now
        let (flush, budgetElapsed) = await withTaskGroup(of: Event.self, returning: (FlushReport?, Bool).self) { group in
            group.addTask { .flushed(await queue.flush(flushMode)) }
            if let budget {
                group.addTask {
                    do {
                        try await time.sleep(budget)
                        return .budgetElapsed
                    } catch {
                        return .timerStopped
                    }
                }
            }
            var flush: FlushReport?
            var budgetElapsed = false
            for await event in group {
                switch event {
                case .flushed(let report):
                    flush = report
                    group.cancelAll()  // stops the budget timer
                case .budgetElapsed:
                    budgetElapsed = true
                    group.cancelAll()  // ends the pass cooperatively
                case .timerStopped:
                    break
                }
            }
            return (flush, budgetElapsed)
        }
        let report = flush ?? FlushReport(trigger: .flush)
        // The budget counts as exhausted only if it actually cut the pass short; a pass that ended
        // on its own at the same moment is complete.
        let exhausted = budgetElapsed && report.wasCancelled
        return DrainCycleReport(
            trigger: trigger,
            startedAt: startedAt,
            endedAt: queue.now,
            flush: report,
            budgetExhausted: exhausted,
            interrupted: report.wasCancelled && !exhausted
        )
    }
}
