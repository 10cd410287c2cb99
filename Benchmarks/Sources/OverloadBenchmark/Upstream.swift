import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// The upstream the overload benchmark drives: an HTTP server of known capacity, run in its own
/// process (`overload-benchmark upstream ...`) so that its CPU is not the client's.
///
/// It has `workers` workers, each busy `serviceTime` per request (a timer, not CPU: the upstream
/// stands for a database or a service whose capacity is its workers, not this machine's cores).
/// A request that finds every worker busy waits in one FIFO line; one that cannot start within
/// `queueTime` is answered `503` at that moment. So its capacity is `workers / serviceTime`
/// requests a second, a request it serves takes between `serviceTime` and `serviceTime +
/// queueTime`, and past its capacity it sheds load the way real servers do, late.
///
/// `POST /workers/N` sets the number of workers (the benchmark halves it midway); requests at
/// work finish, and none starts while more than N are busy.
enum Upstream {
    static func run(workers: Int, serviceTime: TimeAmount, queueTime: TimeAmount) throws {
        // One event loop: every request and the pool's state live on it, so no lock is needed.
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let pool = try loop.submit { NIOLoopBound(WorkerPool(workers: workers, serviceTime: serviceTime, queueTime: queueTime, loop: loop), eventLoop: loop) }.wait()
        let channel = try ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 4096)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.pipeline.configureHTTPServerPipeline(withErrorHandling: true).flatMapThrowing {
                    try channel.pipeline.syncOperations.addHandler(UpstreamHandler(pool: pool.value))
                }
            }
            .bind(host: "127.0.0.1", port: 0)
            .wait()
        // The parent reads the port from the first line.
        FileHandle.standardOutput.write(Data("PORT \(channel.localAddress?.port ?? 0)\n".utf8))
        // The parent kills this process when it is done; a closed stdin (the parent died) ends it too.
        while readLine() != nil {}
        try? channel.close().wait()
        try? group.syncShutdownGracefully()
    }
}

/// The workers and their line. Confined to the server's one event loop.
final class WorkerPool {
    private var workers: Int
    private var busy = 0
    private let serviceTime: TimeAmount
    private let queueTime: TimeAmount
    private let loop: any EventLoop
    private var line: [Job] = []
    private var lineHead = 0

    final class Job {
        let respond: (HTTPResponseStatus) -> Void
        var expiry: Scheduled<Void>?
        var done = false
        init(respond: @escaping (HTTPResponseStatus) -> Void) { self.respond = respond }
    }

    init(workers: Int, serviceTime: TimeAmount, queueTime: TimeAmount, loop: any EventLoop) {
        self.workers = workers
        self.serviceTime = serviceTime
        self.queueTime = queueTime
        self.loop = loop
    }

    func setWorkers(_ count: Int) {
        workers = max(1, count)
        startWaiting()
    }

    func submit(_ respond: @escaping (HTTPResponseStatus) -> Void) {
        let job = Job(respond: respond)
        if busy < workers, lineHead == line.count {
            start(job)
            return
        }
        line.append(job)
        job.expiry = loop.assumeIsolated().scheduleTask(in: queueTime) {
            guard !job.done else { return }
            job.done = true
            job.respond(.serviceUnavailable)
        }
    }

    private func start(_ job: Job) {
        busy += 1
        job.done = true
        loop.assumeIsolated().scheduleTask(in: serviceTime) { [self] in
            job.respond(.ok)
            busy -= 1
            startWaiting()
        }
    }

    private func startWaiting() {
        while busy < workers, lineHead < line.count {
            let job = line[lineHead]
            lineHead += 1
            guard !job.done else { continue }  // answered 503 already
            job.expiry?.cancel()
            start(job)
        }
        if lineHead > 1_024, lineHead * 2 > line.count {
            line.removeFirst(lineHead)
            lineHead = 0
        }
    }
}

/// One connection: each request is answered by the pool, or at once for `POST /workers/N`.
final class UpstreamHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let pool: WorkerPool
    private var uri = ""
    private var keepAlive = true

    init(pool: WorkerPool) { self.pool = pool }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            uri = head.uri
            keepAlive = head.isKeepAlive
        case .body:
            break
        case .end:
            if uri.hasPrefix("/workers/"), let count = Int(uri.dropFirst("/workers/".count)) {
                pool.setWorkers(count)
                respond(context: context, status: .ok, keepAlive: keepAlive)
                return
            }
            let keepAlive = keepAlive
            pool.submit { [self] status in
                respond(context: context, status: status, keepAlive: keepAlive)
            }
        }
    }

    private func respond(context: ChannelHandlerContext, status: HTTPResponseStatus, keepAlive: Bool) {
        guard context.channel.isActive else { return }  // the client gave up on it
        let body = status == .ok ? "{\"ok\":true}" : "busy"
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: String(body.utf8.count))
        headers.add(name: "Content-Type", value: "application/json")
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
        var buffer = context.channel.allocator.buffer(capacity: body.utf8.count)
        buffer.writeString(body)
        context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        if !keepAlive { context.close(promise: nil) }
    }
}
