#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// The Bool spellings the named choices replace, kept for one release.
extension DrainService {
    /// Now `stop()` or `stop(.interruptingCycle)`.
    @available(*, deprecated, message: "use stop() to let the cycle in flight finish, stop(.interruptingCycle) to cut it short")
    public func stop(interruptingCycle: Bool) async {
        await stop(interruptingCycle ? .interruptingCycle : .lettingCycleFinish)
    }

    /// Now `runUntilSignalled(_:stopping:)`.
    @available(*, deprecated, message: "use runUntilSignalled(_:stopping: .interruptingCycle)")
    @discardableResult
    public func runUntilSignalled(_ signals: [Int32] = [SIGTERM, SIGINT], interruptingCycle: Bool) async -> Int32? {
        await runUntilSignalled(signals, stopping: interruptingCycle ? .interruptingCycle : .lettingCycleFinish)
    }
}
