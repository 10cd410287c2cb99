import Foundation
import RequestEngine
@_spi(ResilienceCore) import ResilienceCore
import Retry

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Timers and connectivity: a pass on every reconnect, when the earliest backoff ends (or the
/// offline re-check), and, on storage others add work to, at the poll interval and on arrivals.
extension OfflineQueueEngine {
    func connectivityChanged(_ connected: Bool) async {
        if connected {
            learnedOffline = false
            _ = await runPass(.reconnect)
        } else {
            life.disarm()?.cancel()
        }
    }

    func scheduleTimerIfNeeded(for deadline: Date?) {
        guard let deadline else { return }
        let wait = Duration.clamped(seconds: deadline.timeIntervalSince(now), upperBound: .seconds(86_400))
        let time = self.time
        let replaced = life.arm(at: deadline) { number in
            Task { [weak self] in
                do { try await time.sleep(wait) } catch { return }
                guard let self else { return }
                await self.timerFired(number)
            }
        }
        replaced?.cancel()
    }

    func timerFired(_ number: UInt64) async {
        // Replaced, or stopped, after its sleep ended: no pass (a stopped queue sends nothing).
        guard life.timerFired(number) else { return }
        defer { life.firingEnded(number) }
        guard await reachability.isConnected else { return }
        _ = await runPass(.timer)
    }

    func offlineRecheckDate() -> Date {
        now.addingTimeInterval(configuration.offlineRecheckInterval.seconds)
    }

    /// While started: a pass when the earliest backoff ends, and, on storage others add work to,
    /// at the poll interval at the latest.
    /// After a storage error (`notBefore`), not before the storage's backoff either.
    func scheduleNextTimer(notBefore: Date? = nil) async {
        var earliest = (try? await storage.earliestNextAttempt()) ?? nil
        if let notBefore { earliest = max(earliest ?? notBefore, notBefore) }
        guard storage.othersAddWork else { return scheduleTimerIfNeeded(for: earliest) }
        let poll = now.addingTimeInterval(configuration.storagePollInterval.seconds)
        scheduleTimerIfNeeded(for: min(earliest ?? poll, poll))
    }

    /// When a pass may ask a failing storage again: the retry policy's delay for as many passes
    /// in a row as it failed (the offline re-check interval once the policy has none left).
    func storageRetryDate() -> Date {
        let delay = configuration.retryPolicy.delay(forAttempt: max(0, storageFailures - 1)).map {
            RetryPolicyDelay.sanitized($0, maximum: .seconds(86_400))
        }
        return now.addingTimeInterval((delay ?? configuration.offlineRecheckInterval).seconds)
    }

    /// Runs a pass whenever the storage says another consumer added work.
    func followArrivals() -> Task<Void, Never> {
        let arrivals = storage.arrivals()
        return Task { [weak self] in
            for await _ in arrivals {
                guard let self, !Task.isCancelled else { return }
                guard await self.reachabilityMonitor.isConnected else { continue }
                _ = await self.runPass(.timer)
            }
        }
    }
}
