import Foundation
import Retry

/// For this package's own tests (package access): a fresh folder under the system temp directory,
/// removed when the value is deinitialised.
package final class TemporaryDirectory: Sendable {
    package let url: URL

    package init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("resilience-test-\(UUID().uuidString)", isDirectory: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    /// Names of files directly in the folder (no subfolders), sorted.
    package var fileNames: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? []).filter { name in
            var isDirectory: ObjCBool = false
            _ = FileManager.default.fileExists(atPath: url.appendingPathComponent(name).path, isDirectory: &isDirectory)
            return !isDirectory.boolValue
        }.sorted()
    }
}

/// For this package's own tests (package access): collects an async stream's elements and lets a
/// test wait for a number of them.
package final class StreamCollector<Element: Sendable>: Sendable {
    private struct State {
        var items: [Element] = []
        var waiters: [(id: UUID, count: Int, continuation: CheckedContinuation<Void, Never>)] = []
        var cancelled: Set<UUID> = []
        var finished = false
    }

    private let state = Locked(State())
    private let task: Task<Void, Never>

    package init(_ stream: AsyncStream<Element>) {
        let state = self.state
        task = Task {
            for await item in stream {
                let ready = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                    state.items.append(item)
                    let count = state.items.count
                    let ready = state.waiters.filter { $0.count <= count }.map(\.continuation)
                    state.waiters.removeAll { $0.count <= count }
                    return ready
                }
                for continuation in ready { continuation.resume() }
            }
            // The stream ended: nobody waits for more.
            let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                state.finished = true
                defer { state.waiters.removeAll() }
                return state.waiters.map(\.continuation)
            }
            for continuation in waiting { continuation.resume() }
        }
    }

    deinit { task.cancel() }

    /// The elements so far, in arrival order.
    package var items: [Element] { state.withLock { $0.items } }

    /// Suspends until `count` elements arrived, the stream ended, or the waiting task is cancelled.
    package func wait(for count: Int) async {
        let id = UUID()
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Bool in
                    if state.items.count >= count || state.finished || state.cancelled.remove(id) != nil { return true }
                    state.waiters.append((id, count, continuation))
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else {
                    state.cancelled.insert(id)
                    return nil
                }
                return state.waiters.remove(at: index).continuation
            }
            waiter?.resume()
        }
    }
}
