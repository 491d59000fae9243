// The S3 client against a scripted HTTP server on loopback: what it sends, and what it does with each kind of answer
// (retries, resumed reads, lost answers, aborts). S3's real behaviour (a moto server) is covered by the clients'
// tests (python/tests/test_s3*.py, rust/distckpt/tests/s3.rs, go/...); this covers the failures a real server rarely
// produces on demand.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/testing/status_matchers.h"
#include "core/storage/s3/s3_storage.h"

namespace distckpt {
namespace s3 {
namespace {

struct Received {
  std::string method, target, body;
  std::map<std::string, std::string> headers;  // lower-case names
};

struct Reply {
  int status = 200;
  std::string body;
  std::vector<std::string> headers;  // "Name: value"
  /// Close the connection after this many bytes of the body (the Content-Length announces all of it); -1: send it.
  long cut_after = -1;
  /// Close the connection without answering.
  bool drop = false;
};

// An HTTP/1.1 server on 127.0.0.1 answering each request with handler(request), keeping connections alive.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::function<Reply(const Received&)> handler) : handler_(std::move(handler)) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_, 64), 0);
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~ScriptedServer() {
    stop_ = true;
    acceptor_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : connections_) t.join();
    ::close(listen_);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(connections_.size());
  }
  std::vector<Received> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }

 private:
  void Accept() {
    while (!stop_) {
      pollfd p{listen_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept(listen_, nullptr, nullptr);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      open_.push_back(fd);
      connections_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  static bool ReadMore(int fd, std::string* buf) {
    char chunk[65536];
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buf->append(chunk, static_cast<size_t>(n));
    return true;
  }

  void Serve(int fd) {
    std::string buf;
    for (;;) {
      size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        if (!ReadMore(fd, &buf)) return Close(fd);
      }
      Received r;
      std::string head = buf.substr(0, end);
      buf.erase(0, end + 4);
      size_t line_end = head.find("\r\n");
      const std::string first = head.substr(0, line_end);
      r.method = first.substr(0, first.find(' '));
      r.target = first.substr(first.find(' ') + 1, first.rfind(' ') - first.find(' ') - 1);
      while (line_end != std::string::npos) {
        const size_t next = head.find("\r\n", line_end + 2);
        const std::string line =
            head.substr(line_end + 2, next == std::string::npos ? std::string::npos : next - line_end - 2);
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
          std::string name = line.substr(0, colon);
          for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
        }
        line_end = next;
      }
      const size_t length = r.headers.count("content-length") ? std::stoul(r.headers["content-length"]) : 0;
      while (buf.size() < length) {
        if (!ReadMore(fd, &buf)) return Close(fd);
      }
      r.body = buf.substr(0, length);
      buf.erase(0, length);
      Reply reply;
      {
        std::lock_guard<std::mutex> lock(mu_);
        received_.push_back(r);
      }
      reply = handler_(r);
      if (reply.drop) return Close(fd);
      std::string out = "HTTP/1.1 " + std::to_string(reply.status) +
                        " X\r\nContent-Length: " + std::to_string(reply.body.size()) + "\r\n";
      for (const std::string& h : reply.headers) out += h + "\r\n";
      out += "\r\n";
      const bool cut = reply.cut_after >= 0;
      out += r.method == "HEAD" ? "" : reply.body.substr(0, cut ? reply.cut_after : std::string::npos);
      if (::send(fd, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size()) || cut) {
        return Close(fd);
      }
    }
  }

  void Close(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    for (int& o : open_) {
      if (o == fd) o = -1;
    }
  }

  const std::function<Reply(const Received&)> handler_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> open_;
  std::vector<std::thread> connections_;
  std::vector<Received> received_;
};

Reply Error(int status, const std::string& code) {
  return Reply{status, "<?xml version=\"1.0\"?><Error><Code>" + code +
                           "</Code><Message>said the server</Message>"
                           "<RequestId>rid</RequestId></Error>"};
}

S3Config ConfigFor(const ScriptedServer& server, unsigned attempts = 3) {
  S3Config c;
  c.endpoint = server.endpoint();
  c.region = "us-east-1";
  c.access_key_id = "AKIDTEST";
  c.secret_access_key = "secret";
  c.session_token = "session-token";
  c.max_attempts = attempts;
  c.request_timeout_seconds = 2;
  c.backoff_base = std::chrono::milliseconds(1);
  c.backoff_cap = std::chrono::milliseconds(5);
  auto resolved = ResolveS3Config(c, [](const char*) -> const char* { return nullptr; });
  EXPECT_TRUE(resolved.ok()) << resolved.status().ToString();
  return *resolved;
}

std::shared_ptr<ObjectClient> ClientFor(const ScriptedServer& server, unsigned attempts = 3) {
  auto client = NewS3Client(ConfigFor(server, attempts));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? *client : nullptr;
}

TEST(S3Client, SignsEveryRequestAndSendsTheSessionToken) {
  ScriptedServer server([](const Received&) { return Reply{200, "", {"Content-Length: 0"}}; });
  auto client = ClientFor(server);
  DCKPT_ASSERT_OK(client->Commit("s3://bkt/run/step 1/metadata.dckpt", "meta", /*replace=*/false));
  auto got = server.requests();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].method, "PUT");
  EXPECT_EQ(got[0].target, "/bkt/run/step%201/metadata.dckpt");
  EXPECT_EQ(got[0].body, "meta");
  EXPECT_EQ(got[0].headers["if-none-match"], "*");
  EXPECT_EQ(got[0].headers["x-amz-security-token"], "session-token");
  EXPECT_EQ(got[0].headers["x-amz-content-sha256"], "UNSIGNED-PAYLOAD");
  const std::string auth = got[0].headers["authorization"];
  EXPECT_NE(auth.find("AWS4-HMAC-SHA256 Credential=AKIDTEST/"), std::string::npos) << auth;
  EXPECT_NE(auth.find("/us-east-1/s3/aws4_request"), std::string::npos) << auth;
  EXPECT_NE(auth.find("x-amz-security-token"), std::string::npos) << "the token is signed: " << auth;
  // Every header signed is one the request carries (a header libcurl signs but then drops fails the signature).
  const size_t at = auth.find("SignedHeaders=");
  ASSERT_NE(at, std::string::npos) << auth;
  std::string list = auth.substr(at + 14, auth.find(',', at) - at - 14);
  for (size_t from = 0; from <= list.size();) {
    const size_t semi = std::min(list.find(';', from), list.size());
    const std::string name = list.substr(from, semi - from);
    EXPECT_EQ(got[0].headers.count(name), 1u) << "signed but not sent: " << name << " in " << auth;
    from = semi + 1;
  }
}

TEST(S3Client, AForkedChildNeverUsesItsParentsConnections) {
  ScriptedServer server([](const Received&) { return Reply{200, "", {}}; });
  auto client = ClientFor(server);
  DCKPT_ASSERT_OK(client->Commit("s3://bkt/k", "x", true));
  ASSERT_EQ(server.connections(), 1);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Its own connection; the parent's pooled one is neither used nor closed.
    ::_exit(client->Commit("s3://bkt/k", "y", true).ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(server.connections(), 2);
  DCKPT_EXPECT_OK(client->Commit("s3://bkt/k", "z", true));  // the parent's connection still works, reused
  EXPECT_EQ(server.connections(), 2);
}

TEST(S3Client, RetriesThrottlingAndServerErrorsThenSucceeds) {
  std::atomic<int> n{0};
  ScriptedServer server([&](const Received&) {
    switch (n++) {
      case 0:
        return Error(503, "SlowDown");
      case 1:
        return Error(500, "InternalError");
      case 2:
        return Error(400, "RequestTimeout");
      default:
        return Reply{200};
    }
  });
  auto client = ClientFor(server, 4);
  DCKPT_EXPECT_OK(client->Commit("s3://bkt/k", "x", true));
  EXPECT_EQ(server.requests().size(), 4u);
}

TEST(S3Client, GivesUpAfterMaxAttemptsNamingTheUrlAndTheAnswer) {
  ScriptedServer server([](const Received&) { return Error(503, "SlowDown"); });
  auto client = ClientFor(server, 3);
  Status st = client->Commit("s3://bkt/run/k", "x", true);
  EXPECT_TRUE(StatusIs(st, StatusCode::kIo,
                       {"s3://bkt/run/k", "HTTP 503", "SlowDown", "said the server", "after 3 attempts", "rid"}));
  EXPECT_EQ(server.requests().size(), 3u);
}

TEST(S3Client, DoesNotRetryWhatARetryCannotFix) {
  ScriptedServer server([](const Received& r) {
    return r.target.find("denied") != std::string::npos ? Error(403, "SignatureDoesNotMatch")
                                                        : Error(404, "NoSuchBucket");
  });
  auto client = ClientFor(server, 5);
  EXPECT_TRUE(StatusIs(client->Size("s3://bkt/denied").status(), StatusCode::kIo,
                       {"s3://bkt/denied", "HTTP 403", "credentials", "AKIDTEST"}));
  EXPECT_TRUE(StatusIs(client->List("s3://nobkt/run").status(), StatusCode::kNotFound,
                       {"s3://nobkt/run", "bucket 'nobkt' does not exist", server.endpoint()}));
  EXPECT_EQ(server.requests().size(), 2u);
}

TEST(S3Client, ARefusedConnectionNamesTheEndpoint) {
  std::string endpoint;
  {
    ScriptedServer gone([](const Received&) { return Reply{}; });
    endpoint = gone.endpoint();
  }
  S3Config c;
  c.endpoint = endpoint;
  c.max_attempts = 2;
  c.backoff_base = std::chrono::milliseconds(1);
  auto client = NewS3Client(*ResolveS3Config(c, [](const char*) -> const char* { return nullptr; }));
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(
      StatusIs((*client)->Size("s3://bkt/k").status(), StatusCode::kIo, {"s3://bkt/k", endpoint, "after 2 attempts"}));
}

TEST(S3Client, AReadCutShortResumesWhereItStopped) {
  std::string object(1000, '\0');
  for (size_t i = 0; i < object.size(); ++i) object[i] = static_cast<char>(i * 7);
  std::atomic<int> n{0};
  ScriptedServer server([&](const Received& r) {
    const std::string range = r.headers.at("range");  // bytes=a-b
    const size_t a = std::stoul(range.substr(6)), b = std::stoul(range.substr(range.find('-') + 1));
    Reply reply{206, object.substr(a, b - a + 1), {"Content-Range: bytes " + range.substr(6) + "/1000"}};
    if (n++ == 0) reply.cut_after = 40;
    return reply;
  });
  auto client = ClientFor(server);
  std::string got(500, '\0');
  DCKPT_ASSERT_OK_AND_ASSIGN(size_t read, client->Read("s3://bkt/k", 100, &got[0], got.size()));
  EXPECT_EQ(read, 500u);
  EXPECT_EQ(got, object.substr(100, 500));
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].headers["range"], "bytes=100-599");
  EXPECT_EQ(reqs[1].headers["range"], "bytes=140-599");
}

TEST(S3Client, ReadsTheRightBytesFromAServerThatIgnoresRange) {
  const std::string object = "0123456789abcdef";
  ScriptedServer server([&](const Received&) { return Reply{200, object}; });
  auto client = ClientFor(server);
  std::string got(4, '\0');
  DCKPT_ASSERT_OK_AND_ASSIGN(size_t read, client->Read("s3://bkt/k", 10, &got[0], got.size()));
  EXPECT_EQ(read, 4u);
  EXPECT_EQ(got, "abcd");
}

TEST(S3Client, BytesFromAnotherRangeAreRefused) {
  ScriptedServer server([](const Received&) { return Reply{206, "abcd", {"Content-Range: bytes 0-3/100"}}; });
  auto client = ClientFor(server);
  char buf[4];
  EXPECT_TRUE(StatusIs(client->Read("s3://bkt/k", 50, buf, 4).status(), StatusCode::kCorrupt,
                       {"s3://bkt/k", "Content-Range 'bytes 0-3/100'"}));
}

TEST(S3Client, AReadPastTheEndReadsNothing) {
  ScriptedServer server([](const Received&) { return Error(416, "InvalidRange"); });
  auto client = ClientFor(server);
  char c;
  DCKPT_ASSERT_OK_AND_ASSIGN(size_t read, client->Read("s3://bkt/k", 10, &c, 1));
  EXPECT_EQ(read, 0u);
}

TEST(S3Client, ACommitWhoseAnswerWasLostIsRecognisedAsItsOwn) {
  std::mutex mu;
  std::string stored;
  ScriptedServer server([&](const Received& r) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.method == "PUT") {
      if (!stored.empty()) return Error(412, "PreconditionFailed");
      stored = r.body;
      return Reply{200, "", {}, -1, /*drop=*/true};  // stored, but the answer never arrives
    }
    if (r.method == "HEAD") return Reply{200, stored};
    return Reply{206,
                 stored,
                 {"Content-Range: bytes 0-" + std::to_string(stored.size() - 1) + "/" + std::to_string(stored.size())}};
  });
  auto client = ClientFor(server);
  DCKPT_EXPECT_OK(client->Commit("s3://bkt/ckpt/metadata.dckpt", "the metadata", false));
  // Someone else's object there first: kExists.
  EXPECT_TRUE(StatusIs(client->Commit("s3://bkt/ckpt/metadata.dckpt", "other metadata", false), StatusCode::kExists,
                       {"s3://bkt/ckpt/metadata.dckpt", "412"}));
}

TEST(S3Client, ListsEveryPage) {
  ScriptedServer server([](const Received& r) {
    const bool second = r.target.find("continuation-token=t%2F1") != std::string::npos;
    std::string xml = "<ListBucketResult><Prefix>run/</Prefix>";
    xml += second ? "<Contents><Key>run/b</Key></Contents><IsTruncated>false</IsTruncated>"
                  : "<Contents><Key>run/a</Key></Contents><CommonPrefixes><Prefix>run/step-1/</Prefix>"
                    "</CommonPrefixes><IsTruncated>true</IsTruncated><NextContinuationToken>t/1"
                    "</NextContinuationToken>";
    return Reply{200, xml + "</ListBucketResult>"};
  });
  auto client = ClientFor(server);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, client->List("s3://bkt/run"));
  EXPECT_EQ(names, (std::vector<std::string>{"a", "step-1", "b"}));
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].target, "/bkt/?delimiter=%2F&list-type=2&prefix=run%2F");
}

TEST(S3Client, AStalledServerTimesOut) {
  ScriptedServer server([](const Received&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    return Reply{200};
  });
  S3Config c = ConfigFor(server, 1);
  c.request_timeout_seconds = 1;
  auto client = NewS3Client(c);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(StatusIs((*client)->Size("s3://bkt/k").status(), StatusCode::kTimeout, {"s3://bkt/k"}));
}

// Through ObjectStorage: a file larger than a part streams as a multipart upload; when a part cannot go up, the
// upload is aborted (no parts left behind) and nothing is completed.
TEST(S3Client, AFailedPartAbortsTheUpload) {
  std::mutex mu;
  std::vector<std::string> calls;
  ScriptedServer server([&](const Received& r) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.method == "POST" && r.target.find("?uploads=") != std::string::npos) {
      calls.push_back("begin");
      return Reply{200, "<InitiateMultipartUploadResult><UploadId>up&amp;1</UploadId></InitiateMultipartUploadResult>"};
    }
    if (r.method == "PUT" && r.target.find("partNumber=2") != std::string::npos) {
      calls.push_back("part2");
      return Error(403, "AccessDenied");
    }
    if (r.method == "PUT") {
      calls.push_back("part");
      return Reply{200, "", {"ETag: \"e\""}};
    }
    if (r.method == "DELETE") {
      calls.push_back(r.target.find("uploadId=up%261") != std::string::npos ? "abort" : "delete?");
      return Reply{204};
    }
    calls.push_back(r.method + " " + r.target);
    return Reply{200};
  });
  S3Config c = ConfigFor(server);
  c.part_size = kMinPartSize;
  auto storage = NewS3Storage(c);
  ASSERT_TRUE(storage.ok()) << storage.status().ToString();
  DCKPT_ASSERT_OK_AND_ASSIGN(auto file, (*storage)->CreateFile("s3://bkt/ckpt/data-00000.0123456789abcdef.bin"));
  std::string data(3 * kMinPartSize, 'x');
  Status st = file->WriteAt(0, data.data(), data.size());
  if (st.ok()) st = file->Close();
  EXPECT_TRUE(StatusIs(st, StatusCode::kIo, {"s3://bkt/ckpt/data-00000.0123456789abcdef.bin", "AccessDenied"}));
  file.reset();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front(), "begin");
  EXPECT_EQ(calls.back(), "abort");
  for (const std::string& call : calls) EXPECT_NE(call.find("uploadId=up%261&"), 0u) << call;
}

}  // namespace
}  // namespace s3
}  // namespace distckpt
